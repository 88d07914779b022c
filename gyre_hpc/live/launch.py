"""``gyre train``'s launcher on one machine: mpirun with 1 + K x W ranks, preemption forwarded, no orphan left.

::

    launch(args, world_size, run_dir)                              world_size = 1 + cells x workers per cell
      └─ mpirun --oversubscribe --bind-to none -n 1+KW  python -m gyre_hpc.cli train CONFIG --run-dir RUN_DIR ...
           every rank runs ``gyre_hpc.live.rank.run_rank`` (rank 0 the root, a cell's worker 0 its runner, the
           cell's other workers follow their leader: gyre_hpc.live.workers)

Invariants
- The ranks get this job's own secret (``gyre_hpc.net.auth``) through the environment only, never one inherited
  from the shell, and no SLURM/PMIx/Open MPI world variable of the caller (they would make mpirun join a world).
- Ranks learn of a preemption from RUN_DIR/preempt.request (``LAUNCHED_ENV`` is set for them), never from a
  signal: SIGTERM/SIGUSR1 to the launcher write that file; a second SIGTERM or SIGINT interrupts instead (every
  rank's stacks go to RUN_DIR/traces/, then mpirun's whole session ends).
- mpirun gets SIGTERM when the launcher dies, even by SIGKILL: no process of the run outlives it.
- mpirun and the ranks (and their children) load the bind shim (``live/bind_local.py``) with the interface of
  ``cluster.listen_interface`` (lo by default): their wildcard listeners bind its address; an interface this
  machine lacks is a ``ConfigError`` before anything starts; without a C compiler, one warning and the run goes on.
- Standard library at import time; psutil and the engines' child helper only when used.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from gyre_hpc.launcher import listen
from gyre_hpc.clock import WallClock
from gyre_hpc.errors import ConfigError
from gyre_hpc.files.io import atomic_write_text
from gyre_hpc.live import bind_local
from gyre_hpc.launcher.openmpi import LOCAL_EXPORTS, SINGLE_HOST_EXPORTS

#: set by ``gyre train`` for the ranks it launches: they learn of a preemption from RUN_DIR/preempt.request,
#: never from a signal (a signal from mpirun means it is tearing the job down: a rank was lost)
LAUNCHED_ENV = "GYRE_LAUNCHED"


def launch(args: argparse.Namespace, world_size: int, run_dir: Path, pending=None,
           listen_interface: str | None = None) -> int:
    """mpirun this job with ``world_size`` ranks (``Layout.world_size``) and wait for it; SIGTERM/SIGUSR1 preempt it (RUN_DIR/preempt.request,
    which rank 0 polls; ``pending``: a signal noted before mpirun started), a second one or SIGINT interrupts it.
    ``listen_interface``: ``cluster.listen_interface`` (null: lo, the job is on this machine)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise ConfigError("cluster.cells: a live run needs mpirun (apt-get install openmpi-bin) and mpi4py")
    interface = listen.interface(listen_interface, one_machine=True)
    bind_local.require_interface(interface)  # ConfigError before anything starts
    from gyre_hpc.net import auth

    os.environ[auth.ENV] = auth.new_secret()  # this job's own secret (never one inherited from the shell)
    auth.write_secret(run_dir, os.environ[auth.ENV])  # to the ranks through the environment only
    env = mpirun_env(interface)
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-n", str(world_size)] + rank_command(args, run_dir)
    from gyre_hpc.lifecycle.recovery import REQUEST_FILE

    (run_dir / REQUEST_FILE).unlink(missing_ok=True)  # a request of an earlier segment was served
    shutil.rmtree(run_dir / "errors", ignore_errors=True)  # an earlier segment's (its events.jsonl has them)
    with open(run_dir / "mpirun.log", "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=sys.stderr, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_dies_with_launcher())
        _forward_preemption(proc, run_dir, pending)
        if pending is not None and pending.signal is not None:  # it came while mpirun was being started
            atomic_write_text(run_dir / REQUEST_FILE, pending.signal + "\n")
        try:
            return proc.wait()
        except BaseException:
            _stop_ranks(proc, run_dir)
            raise


def mpirun_env(interface: str) -> dict[str, str]:
    """mpirun's environment, which every rank inherits: this process's, without a caller's MPI/SLURM world, with
    Open MPI's one-host settings, and the bind shim for ``interface`` (``""``: none, and an inherited
    ``GYRE_LISTEN_INTERFACE`` dropped, so an inherited shim binds nothing either)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM", "PMI_"))}
    env.update(dict(e.split("=", 1) for e in LOCAL_EXPORTS))  # Open MPI over loopback TCP, as root
    env.update(dict(e.split("=", 1) for e in SINGLE_HOST_EXPORTS))  # one host: shared memory, no rank listens
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p))
    env[LAUNCHED_ENV] = "1"
    env.pop(listen.ENV, None)
    env.update(bind_local.preload_env(env, interface))  # mpirun's and every rank's wildcard listeners: the interface
    from gyre_hpc.live.lost import KILL_AFTER_S

    env["OMPI_MCA_odls_base_sigkill_timeout"] = str(KILL_AFTER_S)  # a lost rank: rank 0 has time to save
    return env


def _dies_with_launcher():
    """mpirun gets SIGTERM when this launcher dies (even by SIGKILL): it ends its ranks, and they their services
    (gyre_hpc/engines/children.py); no process of the run outlives it."""
    from gyre_hpc.engines.children import dies_with_parent

    return dies_with_parent(signal.SIGTERM)


def rank_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    """What every rank runs: this command, in role mode (inside the MPI world), with the same overrides."""
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(Path(args.config).resolve()), "--run-dir",
           str(run_dir.resolve())]
    return cmd + [a for o in args.overrides for a in ("--set", o)]


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _forward_preemption(proc: subprocess.Popen, run_dir: Path, pending=None) -> None:
    """SIGTERM/SIGUSR1 to ``gyre train`` become RUN_DIR/preempt.request, which rank 0 polls: no rank is
    signalled, so none can die of it while it starts up, and a signal a rank does get is mpirun's teardown.
    ``pending`` notes it too (the supervisor never relaunches a preempted run: live/supervise.py)."""
    from gyre_hpc.lifecycle.recovery import REQUEST_FILE

    def preempt(signum, frame) -> None:
        if pending is not None:
            pending.request(signal.Signals(signum).name)
        print(f"gyre train: {signal.Signals(signum).name}: preempting (the step in progress ends, the resume state "
              f"is saved); send SIGTERM again to interrupt", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            atomic_write_text(run_dir / REQUEST_FILE, signal.Signals(signum).name + "\n")
        signal.signal(signal.SIGTERM, _interrupted)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    signal.signal(signal.SIGTERM, preempt)
    signal.signal(signal.SIGUSR1, preempt)


def _stop_ranks(proc: subprocess.Popen, run_dir: Path) -> None:
    """Interrupted: dump every rank's stacks to RUN_DIR/traces/ (SIGUSR2), then end mpirun's whole session."""
    import psutil

    try:
        ranks = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        ranks = []
    for p in ranks:
        with contextlib.suppress(psutil.Error):
            if "gyre_hpc.cli" in " ".join(p.cmdline()):
                p.send_signal(signal.SIGUSR2)
    WallClock().sleep(1.0)  # the ranks write their stacks meanwhile
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    print(f"gyre train: interrupted; stacks of the ranks in {run_dir / 'traces'}", file=sys.stderr)
