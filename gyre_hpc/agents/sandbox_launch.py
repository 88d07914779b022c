"""Sandbox launcher (run as a script by ``python -I``, inside ``unshare --mount --net``): stdlib only, no gyre import.

``python -I sandbox_launch.py DIR [DIR ...] -- ARGV...`` makes every mount of the new mount namespace read-only
except the listed directories (bind-mounted writable over themselves), drops every capability (bounding,
inheritable, ambient and current sets, and no_new_privs: the command keeps uid 0 for file ownership but cannot
remount, mount, or regain a capability through exec), and execs ARGV. The network namespace that ``unshare
--net`` made has only a downed loopback: no socket reaches anything.

Invariants
- ARGV runs only when every mount was made read-only; if one remount fails, the launcher exits with
  ``SANDBOX_FAILED`` and says which mount, and nothing runs.
- ARGV runs with no capabilities: writes outside the listed directories fail with EROFS for every uid.
- ARGV starts in the launcher's cwd re-resolved after the mounts: a cwd inside a listed directory is writable.
"""
import ctypes
import os
import sys

SANDBOX_FAILED = 97
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, flags):
    src = source.encode() if source else None
    if _libc.mount(src, target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def _mount_points():
    """(mount point, options) of every mount, in mount order; octal escapes (``\\040``) decoded."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            yield point, fields[5].split(",")


def main(args):
    sep = args.index("--")
    writable, argv = [os.path.realpath(d) for d in args[:sep]], args[sep + 1:]
    _mount(None, "/", MS_REC | MS_PRIVATE)  # nothing below propagates back to the host's namespace
    for d in writable:
        _mount(d, d, MS_BIND)
    for point, options in _mount_points():
        if point in writable or "ro" in options:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, bit in KEPT_FLAGS.items():
            flags |= bit if name in options else 0
        try:
            _mount(None, point, flags)
        except OSError as exc:
            sys.stderr.write(f"gyre sandbox: cannot make {point} read-only: {exc}\n")
            return SANDBOX_FAILED
    try:
        _drop_capabilities()
    except OSError as exc:
        sys.stderr.write(f"gyre sandbox: cannot drop capabilities: {exc}\n")
        return SANDBOX_FAILED
    os.chdir(os.getcwd())  # re-enter the cwd by path: it may lie under a directory just bind-mounted writable
    os.execv(argv[0], argv)


def _drop_capabilities():
    """Empty the bounding set, the ambient set, then the effective/permitted/inheritable sets; no_new_privs."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP", str(cap))
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}, all zero
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
