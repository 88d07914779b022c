"""The bind shim (gyre_hpc/native/bind_local.c, built by gyre_hpc.live.bind_local): what a process that loads it
binds, seen from Python in a subprocess (getsockname), and how it is built and handed to mpirun."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gyre_hpc.errors import ConfigError
from gyre_hpc.launcher.listen import ENV
from gyre_hpc.live import bind_local
from gyre_hpc.live.launch import mpirun_env

#: binds one socket as told and prints what it got: [host, port] or {"errno": n}
PROBE = textwrap.dedent("""
    import json, socket, sys
    family, kind, host, port, v6only, then = json.loads(sys.argv[1])
    s = socket.socket(getattr(socket, family), getattr(socket, kind))
    if v6only is not None:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
    try:
        if host is not None:
            s.bind((host, port) if family != "AF_UNIX" else host)
        if then == "listen":
            s.listen()
        got = s.getsockname()
        print(json.dumps(list(got[:2]) if family != "AF_UNIX" else [got, 0]))
        if then == "connect":  # a peer reaches it at the IPv4 address peers are told
            s.listen()
            c = socket.create_connection(("127.0.0.1", got[1]), timeout=5)
            a, _ = s.accept()
            c.sendall(b"ok"); print(json.dumps(a.recv(2).decode()))
    except OSError as exc:
        print(json.dumps({"errno": exc.errno}))
""")


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    built = bind_local.library(cache=tmp_path_factory.mktemp("cache"))
    assert built is not None and built.is_file()
    return built


def bound(lib: Path | None, interface: str | None, family="AF_INET", kind="SOCK_STREAM", host="0.0.0.0", port=0,
          v6only=None, then=None) -> tuple[list, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "LD_PRELOAD")}
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    if interface is not None:
        env[ENV] = interface
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps([family, kind, host, port, v6only, then])],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    return (lines[0] if len(lines) == 1 else lines), out.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_wildcard_ipv4_bind_gets_the_interfaces_address_and_keeps_its_port(lib):
    port = free_port()
    assert bound(lib, "lo", port=port)[0] == ["127.0.0.1", port]
    host, ephemeral = bound(lib, "lo")[0]
    assert host == "127.0.0.1" and ephemeral > 0
    assert bound(lib, "lo", kind="SOCK_DGRAM")[0][0] == "127.0.0.1"


def test_a_dual_stack_wildcard_bind_gets_the_ipv4_mapped_address_and_peers_reach_it_at_127_0_0_1(lib):
    (host, _), answer = bound(lib, "lo", family="AF_INET6", host="::", then="connect")[0]
    assert host == "::ffff:127.0.0.1"
    assert answer == "ok"


def test_ipv4s_any_address_on_an_ipv6_socket_is_a_wildcard_too(lib):
    assert bound(None, None, family="AF_INET6", host="::ffff:0.0.0.0")[0][0] == "::ffff:0.0.0.0"
    assert bound(lib, "lo", family="AF_INET6", host="::ffff:0.0.0.0")[0][0] == "::ffff:127.0.0.1"


def test_an_ipv6_only_wildcard_bind_gets_the_interfaces_ipv6_address(lib):
    assert bound(lib, "lo", family="AF_INET6", host="::", v6only=1)[0][0] == "::1"
    assert bound(lib, "lo", family="AF_INET6", kind="SOCK_DGRAM", host="::", v6only=1)[0][0] == "::1"


def test_a_tcp_socket_that_listens_without_a_bind_gets_the_interfaces_address(lib):
    assert bound(lib, "lo", host=None, then="listen")[0][0] == "127.0.0.1"
    assert bound(None, None, host=None, then="listen")[0][0] == "0.0.0.0"  # what the kernel does without the shim


def test_every_other_bind_passes_through_untouched(lib, tmp_path):
    assert bound(lib, "lo", host="127.0.0.2")[0][0] == "127.0.0.2"
    assert bound(lib, "lo", family="AF_INET6", host="::1", v6only=1)[0][0] == "::1"
    path = str(tmp_path / "unix.sock")
    assert bound(lib, "lo", family="AF_UNIX", host=path)[0][0] == path


@pytest.mark.parametrize("interface", [None, ""])
def test_without_an_interface_the_loaded_shim_changes_nothing(lib, interface):
    assert bound(lib, interface)[0][0] == "0.0.0.0"
    assert bound(lib, interface, family="AF_INET6", host="::")[0][0] == "::"


def test_an_unknown_interface_refuses_wildcard_binds_with_one_line_and_never_binds_the_wildcard(lib):
    got, err = bound(lib, "nosuch0")
    assert got == {"errno": 99}  # EADDRNOTAVAIL
    assert err.count("\n") == 1 and "GYRE_LISTEN_INTERFACE=nosuch0 has no IPv4 address" in err
    assert bound(lib, "nosuch0", family="AF_INET6", host="::")[0] == {"errno": 99}
    assert bound(lib, "nosuch0", host="127.0.0.1")[0][0] == "127.0.0.1"  # a specific bind still works


def other_interface() -> tuple[str, str, str | None]:
    """A non-loopback interface with an IPv4 address: (name, IPv4, IPv6 or None)."""
    psutil = pytest.importorskip("psutil")
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        v4 = [a.address for a in addrs if a.family == socket.AF_INET]
        v6 = [a.address for a in addrs if a.family == socket.AF_INET6 and not a.address.startswith("fe80")]
        if v4 and not v4[0].startswith("127."):
            return name, v4[0], (v6[0] if v6 else None)
    pytest.skip("this machine has no non-loopback interface with an IPv4 address")


def test_on_another_interface_each_family_gets_that_interfaces_own_address(lib):
    """Binds only (no listen): nothing is reachable from outside during the test."""
    name, v4, v6 = other_interface()
    assert bound(lib, name)[0][0] == v4
    assert bound(lib, name, family="AF_INET6", host="::")[0][0] == f"::ffff:{v4}"
    assert bound(lib, name, family="AF_INET6", host="::", v6only=1)[0][0] == (v6 or "::1")


# ----------------------------------------------------------------------------------------------- the build


def test_the_library_is_built_once_per_source_and_then_found_in_the_cache(tmp_path):
    first = bind_local.library(cache=tmp_path)
    assert first == bind_local.library_path(tmp_path) and first.is_file()
    mtime = first.stat().st_mtime_ns
    assert bind_local.library(cache=tmp_path, compiler="no-such-cc") == first  # a cache hit needs no compiler
    assert first.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left behind


def test_the_librarys_name_follows_the_sources_hash(tmp_path, monkeypatch):
    source = tmp_path / "bind_local.c"
    source.write_text(bind_local.SOURCE.read_text())
    monkeypatch.setattr(bind_local, "SOURCE", source)
    before = bind_local.library_path(tmp_path)
    source.write_text(source.read_text() + "\n/* changed */\n")
    assert bind_local.library_path(tmp_path) != before


def test_no_compiler_is_one_warning_and_no_shim_never_an_error(tmp_path, capsys):
    assert bind_local.library(cache=tmp_path, compiler="no-such-cc") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no C compiler (no-such-cc)" in err and "wildcard" in err
    assert not list(tmp_path.iterdir())


def test_a_failed_build_is_one_warning_and_leaves_no_file(tmp_path, monkeypatch, capsys):
    source = tmp_path / "bind_local.c"
    source.write_text("this is not C\n")
    monkeypatch.setattr(bind_local, "SOURCE", source)
    cache = tmp_path / "cache"
    assert bind_local.library(cache=cache) is None
    assert "failed to build bind_local.c" in capsys.readouterr().err
    assert not list(cache.iterdir())


def test_the_module_prints_the_librarys_path_or_nothing_and_always_exits_0(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "gyre_hpc.live.bind_local"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and Path(out.stdout.strip()).is_file()
    assert Path(out.stdout.strip()).parent == tmp_path / "gyre_hpc"
    out = subprocess.run([sys.executable, "-m", "gyre_hpc.live.bind_local"], env={**env, "CC": "no-such-cc",
                         "XDG_CACHE_HOME": str(tmp_path / "empty")}, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "" and "no C compiler" in out.stderr


# ------------------------------------------------------------------------------------------ the launcher


def test_preload_env_puts_the_shim_first_and_keeps_an_existing_preload(lib):
    assert bind_local.preload_env({}, "lo", lib) == {ENV: "lo", "LD_PRELOAD": str(lib)}
    got = bind_local.preload_env({"LD_PRELOAD": "/opt/other.so"}, "lo", lib)
    assert got["LD_PRELOAD"] == f"{lib}:/opt/other.so"
    assert bind_local.preload_env({}, "", lib) == {}


def test_mpirun_gets_the_shim_for_the_interface_and_none_when_off(lib, monkeypatch):
    monkeypatch.setattr(bind_local, "library", lambda: lib)
    monkeypatch.setenv(ENV, "eth9")  # inherited from a caller: never what the ranks use
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    env = mpirun_env("lo")
    assert env[ENV] == "lo" and env["LD_PRELOAD"] == f"{lib}:/opt/other.so"
    off = mpirun_env("")
    assert ENV not in off and off["LD_PRELOAD"] == "/opt/other.so"


def test_mpirun_without_a_compiler_gets_no_shim(monkeypatch):
    monkeypatch.setattr(bind_local, "library", lambda: None)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    env = mpirun_env("lo")
    assert ENV not in env and "LD_PRELOAD" not in env


def test_an_interface_this_machine_lacks_is_a_config_error_naming_the_key():
    bind_local.require_interface("lo")
    bind_local.require_interface("")
    with pytest.raises(ConfigError, match=r"cluster\.listen_interface: this machine has no interface 'nosuch0'"):
        bind_local.require_interface("nosuch0")


@pytest.mark.parametrize("interface,kept", [("lo", True), ("eth0", False), ("", False)])
def test_engines_and_the_proxy_keep_the_shims_interface_only_when_it_is_loopback(monkeypatch, interface, kept):
    """A service's internal wildcard listeners (torch's TCPStore) are reached at 127.0.0.1: another interface's
    address would refuse them, so there the inherited shim is told nothing and binds nothing."""
    from gyre_hpc.net import auth
    from gyre_hpc.engines.children import child_env

    monkeypatch.setenv(auth.ENV, "s" * 43)
    monkeypatch.setenv(ENV, interface)
    assert (child_env().get(ENV) == interface) == kept
    assert (ENV in child_env()) == kept


def test_a_service_started_without_the_shims_variable_gets_an_environment_without_it(monkeypatch):
    """Engines and proxies started outside a run (tests, ``gyre serve``) have no GYRE_LISTEN_INTERFACE at all."""
    from gyre_hpc.net import auth
    from gyre_hpc.engines.children import child_env

    monkeypatch.setenv(auth.ENV, "s" * 43)
    monkeypatch.delenv(ENV, raising=False)
    assert ENV not in child_env()


@pytest.mark.parametrize("what", ["library", "directory"])
def test_a_library_others_can_write_is_never_loaded(tmp_path, capsys, what):
    lib = bind_local.library(cache=tmp_path)
    (lib if what == "library" else tmp_path).chmod(0o777 if what == "directory" else 0o666)
    assert bind_local.library(cache=tmp_path) is None
    assert "is not this user's alone" in capsys.readouterr().err
