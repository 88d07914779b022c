"""Service child processes (engines, the proxy) that never outlive the process that started them. Edge: Linux.

``spawn`` starts a child
- in its own session and process group (``start_new_session``), so that ``stop`` ends the child and everything
  it started (SGLang's scheduler and detokenizer processes) by one ``killpg``;
- with a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set between fork and exec): when the starting
  process dies, however it dies (SIGKILL included), the kernel kills the child;
- with the job secret (``auth.ensure_secret``: generated here when the process has none) and the parent's PID
  (``serving.PARENT_ENV``, for the child's own watchdog) in its environment, never on its command line;
- with SIGUSR1 (the ranks' preemption signal; on submitit's tasks the time-limit signal too) ignored from its
  first instruction;
- with the bind shim's interface (``gyre_hpc.launcher.listen``) only when it is the loopback one: a child's internal
  wildcard listeners (torch's TCPStore) are reached at 127.0.0.1, which another interface's address would refuse.

Invariants (tests/integration/test_no_orphans.py)
- Linux delivers the parent-death signal when the *thread* that forked the child exits, so every child is forked
  by one long-lived thread of this module (``_SPAWNER``), never by a caller's worker thread that may end first.
- ``stop`` signals the child's process group, never a process by name: SIGTERM, then SIGKILL after the grace
  period (to the group again, so no grandchild is left).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import signal
import subprocess
from typing import IO, Mapping, Sequence

from gyre_hpc.net import auth
from gyre_hpc.launcher import listen
from gyre_hpc.lifecycle import rank_signals

PR_SET_PDEATHSIG = 1
PARENT_ENV = "GYRE_PARENT_PID"  # the same name as serving.PARENT_ENV (serving imports FastAPI; this must not)

_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gyre-spawner")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def ignore_preemption_signal() -> None:
    """SIGUSR1 (the ranks' preemption signal, which mpirun and srun deliver to every process of the job) is
    ignored, and on submitit's SLURM tasks the time-limit signal too (USR2: ``rank_signals.service_ignored``);
    an ignored signal stays ignored across exec (serving.py re-asserts it)."""
    sigs = rank_signals.current()
    for s in sigs.nums(sigs.service_ignored):
        signal.signal(s, signal.SIG_IGN)


def child_setup() -> None:
    """``preexec_fn``: die with the parent (SIGKILL) and ignore SIGUSR1 from the child's first instruction on,
    so a service still starting up cannot be killed by the preemption signal."""
    ignore_preemption_signal()
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl: the signal will never come
        os._exit(1)


def dies_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` for a launcher's own child (mpirun): ``sig`` when the launcher dies, however it dies. Call
    ``Popen`` from a thread that lives as long as the launcher (its main thread): the signal follows the thread."""
    def setup() -> None:
        _libc().prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() == 1:
            os._exit(1)
    return setup


def child_env(drop: Sequence[str] = ()) -> dict[str, str]:
    """This process's environment for a service child: without ``drop``, with the job secret and our PID."""
    secret = auth.ensure_secret()
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({auth.ENV: secret, PARENT_ENV: str(os.getpid())})
    if not listen.services_keep(env.get(listen.ENV, "")):  # the bind shim (inherited) then binds nothing here
        env.pop(listen.ENV, None)
    return env


def spawn(cmd: Sequence[str], log: IO[bytes], env: Mapping[str, str]) -> subprocess.Popen:
    """Start ``cmd`` (stdout and stderr to ``log``) as described in the module docstring."""
    rank_signals.current()  # decided here, in the parent: ``child_setup`` after the fork only reads it

    def start() -> subprocess.Popen:
        return subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env), start_new_session=True, preexec_fn=child_setup)

    return _SPAWNER.submit(start).result()


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """End the child's process group: SIGTERM, SIGKILL after ``grace_s``; returns the child's exit status."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)  # whatever of the group is left (the child may be gone already)
    proc.wait()
    return proc.returncode


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
