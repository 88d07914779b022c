/* bind_local: an LD_PRELOAD shim that moves wildcard listeners onto one interface's address.
 *
 * Some listeners of a run have no bind setting: mpirun's own (Open MPI 4.1 / PMIx 3), Open MPI's TCP BTL
 * (btl_tcp_if_include limits what it uses, not where it listens), Mooncake's P2P handshake daemon
 * (SocketHandShakePlugin::startDaemon binds INADDR_ANY / in6addr_any). This library interposes bind(2) and
 * listen(2) in every process that loads it (LD_PRELOAD, inherited by children) and rewrites only wildcard
 * addresses; gyre_hpc/live/bind_local.py builds it and says where it applies.
 *
 * GYRE_LISTEN_INTERFACE names the interface (unset or empty: the shim does nothing). Its addresses are read with
 * getifaddrs at each wildcard bind, in each process, so every node of a cluster uses its own address.
 *
 * Rules (tests/unit/test_bind_local.py):
 *  - bind of an AF_INET stream/datagram socket to 0.0.0.0:P    -> the interface's IPv4 address, port P;
 *  - bind of an AF_INET6 stream/datagram socket to [::]:P (or [::ffff:0.0.0.0]:P: -> ::ffff:<IPv4 address>):
 *      dual-stack socket (IPV6_V6ONLY off, Linux's default)   -> ::ffff:<IPv4 address>, port P (it keeps
 *                                                                serving the IPv4 address peers are told);
 *                                                                an interface without IPv4: its IPv6 address
 *      IPv6-only socket                                        -> the interface's IPv6 address (::1 for lo;
 *                                                                a global one before a link-local one);
 *                                                                an interface without IPv6: ::1 (this node only)
 *  - listen on a TCP socket never bound (the kernel would pick the wildcard) binds it first as above, port 0;
 *  - every other bind (a specific address, AF_UNIX, netlink, raw sockets) passes through untouched;
 *  - no address to rewrite to (no such interface, or it has no address of the family needed): the wildcard
 *    bind fails with EADDRNOTAVAIL, and one line on stderr says why (once per process). Never wildcard.
 * Not covered: statically linked programs and programs that make the bind system call themselves (Go).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ENV_INTERFACE "GYRE_LISTEN_INTERFACE"

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*listen_fn)(int, int);

struct iface_addrs {
    int has4, has6, loopback;
    struct in_addr v4;
    struct in6_addr v6;
    unsigned int v6_scope; /* interface index for a link-local address, else 0 */
};

static void *next_symbol(const char *name) {
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL) {
        static const char msg[] = "gyre bind_local: dlsym(RTLD_NEXT) found no libc symbol\n";
        (void)!write(2, msg, sizeof msg - 1);
        abort();
    }
    return fn;
}

static bind_fn real_bind(void) {
    static bind_fn fn;
    bind_fn f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
    if (f == NULL) {
        f = (bind_fn)next_symbol("bind");
        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    }
    return f;
}

static listen_fn real_listen(void) {
    static listen_fn fn;
    listen_fn f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
    if (f == NULL) {
        f = (listen_fn)next_symbol("listen");
        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    }
    return f;
}

static const char *interface_name(void) {
    const char *name = getenv(ENV_INTERFACE);
    return (name != NULL && name[0] != '\0') ? name : NULL;
}

/* The interface's first IPv4 address and best IPv6 address (global before link-local). */
static int read_interface(const char *name, struct iface_addrs *out) {
    struct ifaddrs *all, *a;
    int v6_link_local = 0;
    memset(out, 0, sizeof *out);
    if (getifaddrs(&all) != 0)
        return -1;
    for (a = all; a != NULL; a = a->ifa_next) {
        if (a->ifa_addr == NULL || strcmp(a->ifa_name, name) != 0)
            continue;
        if (a->ifa_flags & IFF_LOOPBACK)
            out->loopback = 1;
        if (a->ifa_addr->sa_family == AF_INET && !out->has4) {
            out->v4 = ((const struct sockaddr_in *)a->ifa_addr)->sin_addr;
            out->has4 = 1;
        } else if (a->ifa_addr->sa_family == AF_INET6) {
            const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)a->ifa_addr;
            int link_local = IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr);
            if (!out->has6 || (v6_link_local && !link_local)) {
                out->v6 = s6->sin6_addr;
                out->v6_scope = link_local ? s6->sin6_scope_id : 0;
                out->has6 = 1;
                v6_link_local = link_local;
            }
        }
    }
    freeifaddrs(all);
    return 0;
}

static void warn_once(const char *name, const char *what) {
    static int warned;
    char line[256];
    int n;
    if (__atomic_exchange_n(&warned, 1, __ATOMIC_ACQ_REL))
        return;
    n = snprintf(line, sizeof line, "gyre bind_local: %s=%s has no %s address (no such interface?): a bind to the "
                 "wildcard address fails with EADDRNOTAVAIL\n", ENV_INTERFACE, name, what);
    if (n > 0)
        (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* SOCK_STREAM or SOCK_DGRAM (TCP or UDP once the family is AF_INET/AF_INET6): the only sockets rewritten;
 * 0 for any other type. */
static int socket_type(int fd) {
    int type = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0)
        return 0;
    return (type == SOCK_STREAM || type == SOCK_DGRAM) ? type : 0;
}

static int v6_only(int fd) {
    int on = 0;
    socklen_t len = sizeof on;
    return getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, &len) == 0 && on;
}

/* Fill *out with the rewritten address of a wildcard bind of family ``family`` to ``port`` (network order).
 * Returns 1 when rewritten, -1 (errno EADDRNOTAVAIL) when there is nothing to rewrite to. */
static int rewrite(int fd, int family, int mapped_any, in_port_t port, const char *name,
                   struct sockaddr_storage *out, socklen_t *out_len) {
    struct iface_addrs ifa;
    memset(out, 0, sizeof *out);
    if (read_interface(name, &ifa) != 0)
        return -1; /* errno from getifaddrs */
    if (family == AF_INET) {
        struct sockaddr_in *s = (struct sockaddr_in *)out;
        if (!ifa.has4) {
            warn_once(name, "IPv4");
            errno = EADDRNOTAVAIL;
            return -1;
        }
        s->sin_family = AF_INET;
        s->sin_port = port;
        s->sin_addr = ifa.v4;
        *out_len = sizeof *s;
        return 1;
    }
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)out;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = port;
    *out_len = sizeof *s6;
    if ((mapped_any || !v6_only(fd)) && ifa.has4) { /* dual-stack: IPv4-mapped, reachable at the IPv4 address */
        s6->sin6_addr.s6_addr[10] = 0xff;
        s6->sin6_addr.s6_addr[11] = 0xff;
        memcpy(&s6->sin6_addr.s6_addr[12], &ifa.v4, 4);
        return 1;
    }
    if (mapped_any) { /* ::ffff:0.0.0.0 means IPv4's any: only an IPv4 address replaces it */
        warn_once(name, "IPv4");
        errno = EADDRNOTAVAIL;
        return -1;
    }
    if (ifa.has6) {
        s6->sin6_addr = ifa.v6;
        s6->sin6_scope_id = ifa.v6_scope;
        return 1;
    }
    if (ifa.has4) { /* an IPv6-only socket on an interface without IPv6: this node only */
        s6->sin6_addr = in6addr_loopback;
        return 1;
    }
    warn_once(name, "IPv4 or IPv6");
    errno = EADDRNOTAVAIL;
    return -1;
}

/* ::ffff:0.0.0.0, IPv4's any address on an IPv6 socket */
static int is_mapped_any(const struct in6_addr *a) {
    static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(a->s6_addr, prefix, 12) == 0 && a->s6_addr[12] == 0 && a->s6_addr[13] == 0 &&
           a->s6_addr[14] == 0 && a->s6_addr[15] == 0;
}

/* 0 for a specific address; 1 for 0.0.0.0 or ::; 2 for ::ffff:0.0.0.0 */
static int is_wildcard(const struct sockaddr *addr, socklen_t len) {
    if (addr == NULL)
        return 0;
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in))
        return ((const struct sockaddr_in *)addr)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)addr)->sin6_addr;
        return IN6_IS_ADDR_UNSPECIFIED(a) ? 1 : is_mapped_any(a) ? 2 : 0;
    }
    return 0;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    const char *name = interface_name();
    struct sockaddr_storage moved;
    socklen_t moved_len = 0;
    int wildcard = name == NULL ? 0 : is_wildcard(addr, len);
    if (wildcard == 0 || socket_type(fd) == 0)
        return real_bind()(fd, addr, len);
    in_port_t port = addr->sa_family == AF_INET ? ((const struct sockaddr_in *)addr)->sin_port
                                                : ((const struct sockaddr_in6 *)addr)->sin6_port;
    if (rewrite(fd, addr->sa_family, wildcard == 2, port, name, &moved, &moved_len) < 0)
        return -1;
    return real_bind()(fd, (const struct sockaddr *)&moved, moved_len);
}

int listen(int fd, int backlog) {
    const char *name = interface_name();
    struct sockaddr_storage self;
    socklen_t len = sizeof self;
    if (name != NULL && socket_type(fd) == SOCK_STREAM && getsockname(fd, (struct sockaddr *)&self, &len) == 0 &&
        (self.ss_family == AF_INET || self.ss_family == AF_INET6) && is_wildcard((struct sockaddr *)&self, len) &&
        (self.ss_family == AF_INET ? ((struct sockaddr_in *)&self)->sin_port
                                   : ((struct sockaddr_in6 *)&self)->sin6_port) == 0) {
        /* never bound: the kernel would bind the wildcard address with an ephemeral port */
        struct sockaddr_storage moved;
        socklen_t moved_len = 0;
        if (rewrite(fd, self.ss_family, 0, 0, name, &moved, &moved_len) < 0 ||
            real_bind()(fd, (const struct sockaddr *)&moved, moved_len) != 0)
            return -1;
    }
    return real_listen()(fd, backlog);
}
