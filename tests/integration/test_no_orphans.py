"""No orphans (gyre_hpc/engines/children.py, serving.watch_parent): whatever way the process that started an engine
or the proxy ends (SIGKILL included), within 10 s none of its service processes remains and none of their ports
listens. Waits are on the condition with a deadline, never fixed sleeps.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from live_run import launcher_env

from gyre_hpc.engines import children
from gyre_hpc.lifecycle.recovery import ORPHAN_EXIT
from gyre_hpc.net.serving import PARENT_ENV

pytestmark = [pytest.mark.slow]

WITHIN_S = 10.0

#: a stand-in for a rank: starts the proxy and a local engine, prints their PIDs and ports, then waits forever
PARENT = textwrap.dedent("""
    import json, sys, time
    from gyre_hpc.config import EngineConfig, ModelConfig, ProxyConfig
    from gyre_hpc.engines.launch import free_port, on_free_port, start_local_engine
    from gyre_hpc.proxy.launch import start_proxy
    out = sys.argv[1]
    proxy = on_free_port(start_proxy, ProxyConfig(), log_path=out + "/proxy.log", config_dir=out)
    engine = on_free_port(start_local_engine, EngineConfig(), ModelConfig(), log_path=out + "/engine.log",
                          config_dir=out)
    print(json.dumps({"proxy": [proxy.pid, proxy.url], "engine": [engine.pid, engine.url]}), flush=True)
    time.sleep(3600)
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _listens(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
        return True
    except OSError:
        return False


def _within(cond, seconds: float = WITHIN_S) -> float:
    """Seconds until ``cond()`` held; fails at the deadline."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < seconds, f"not within {seconds} s"
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.mark.megatron
@pytest.mark.engine
def test_sigkill_of_the_starting_process_ends_its_engine_and_proxy_and_frees_their_ports(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        line = parent.stdout.readline()
        assert line, "the parent died before its services were up (see the logs in tmp_path)"
        started = json.loads(line)
        services = [tuple(v) for v in started.values()]
        assert all(not _gone(pid) and _listens(url) for pid, url in services)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        _within(lambda: all(_gone(pid) and not _listens(url) for pid, url in services))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_service_whose_parent_is_gone_exits_on_its_own_watchdog(tmp_path):
    """No parent-death signal here (a plain Popen, as a process started by something else): the service's own
    watchdog (``serving.watch_parent``) notices the re-parenting and exits."""
    child = "import time; from gyre_hpc.net.serving import watch_parent; watch_parent(); print('up', flush=True); " \
            "time.sleep(3600)"
    middle = textwrap.dedent(f"""
        import os, subprocess, sys
        env = dict(os.environ, {PARENT_ENV}=str(os.getpid()))
        p = subprocess.Popen([sys.executable, "-c", {child!r}], env=env, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline() == "up\\n"
        print(p.pid, flush=True)
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", middle], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    orphan = int(out.stdout)
    _within(lambda: _gone(orphan))


def test_a_service_started_after_its_parent_died_exits_at_once():
    env = dict(os.environ, **{PARENT_ENV: "999999999"})  # a parent PID that is not this child's parent
    code = "import time; from gyre_hpc.net.serving import watch_parent; watch_parent(); time.sleep(3600)"
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == ORPHAN_EXIT


def test_stop_ends_the_childs_whole_process_group(tmp_path):
    with open(tmp_path / "log", "ab") as log:
        proc = children.spawn(["sh", "-c", "sleep 3600 & echo $! ; wait"], log, children.child_env())
    grandchild = None
    deadline = time.monotonic() + WITHIN_S
    while grandchild is None:
        text = (tmp_path / "log").read_text().strip()
        grandchild = int(text) if text else None
        assert time.monotonic() < deadline
        if grandchild is None:
            time.sleep(0.05)
    assert os.getpgid(grandchild) == proc.pid  # the child leads its own group, its children are in it
    children.stop(proc, grace_s=5.0)
    _within(lambda: _gone(grandchild))


def test_a_spawned_child_gets_the_job_secret_and_its_parents_pid_through_its_environment(tmp_path):
    env = children.child_env()
    code = "import os; print(os.environ['GYRE_JOB_SECRET'] == os.environ['EXPECTED'], os.environ['GYRE_PARENT_PID'])"
    with open(tmp_path / "log", "ab") as log:
        proc = children.spawn([sys.executable, "-c", code], log, {**env, "EXPECTED": env["GYRE_JOB_SECRET"]})
    assert proc.wait() == 0
    assert (tmp_path / "log").read_text().split() == ["True", str(os.getpid())]


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _listening(procs: list[psutil.Process]) -> set[int]:
    ports = set()
    for proc in procs:
        try:
            ports |= {c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            continue
    return ports


@pytest.mark.mpi
@pytest.mark.megatron
def test_sigkill_of_the_launcher_ends_mpirun_its_ranks_and_their_services(tmp_path):
    """``gyre train`` killed outright: mpirun gets its parent-death signal, ends the ranks, and they their proxy."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", os.path.join(root, "configs", "local.yaml"),
           "--set", "allocator.steps=2", "--set", f"run.out_dir={tmp_path}"]
    with open(tmp_path / "launcher.log", "wb") as log:
        launcher = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=launcher_env())
    procs: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300.0
        while not any("gyre_hpc.proxy.server" in _cmdline(p) and _listening([p]) for p in procs):
            assert launcher.poll() is None and time.monotonic() < deadline, "the run's proxy never listened"
            time.sleep(0.2)
            procs = _tree(launcher.pid)
        pids, ports = [p.pid for p in procs if p.pid != launcher.pid], _listening(procs)
        assert any("mpirun" in _cmdline(p) for p in procs) and ports
        launcher.kill()
        launcher.wait()
        _within(lambda: all(_gone(pid) for pid in pids) and not (_listening_anywhere() & ports))
    finally:
        for proc in procs:  # only if the test failed: nothing of what it started is left behind
            if proc.pid != launcher.pid and not _gone(proc.pid):
                proc.kill()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return ""


def _listening_anywhere() -> set[int]:
    return {c.laddr.port for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
