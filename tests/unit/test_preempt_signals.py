"""A rank whose role has ended exits with its own status even when a preemption signal arrives while the
interpreter and MPI finalize (gyre_hpc.live.preempt, ``Preemption.ignore``).

The child process below registers glibc's ``raise`` with ``on_exit``: after Python has finalized (where mpi4py's
MPI_Finalize runs, and where Python has given every Python-handled signal its default action back), exit()
calls ``raise(status)``. Exiting with the status SIGUSR1 (10) or SIGTERM (15) thus delivers that very signal at
the moment a late signal from mpirun or srun arrives in a real run.
"""
import signal
import subprocess
import sys

import pytest

CHILD = """
import ctypes, signal, sys
from gyre_hpc.live.preempt import Preemption
libc = ctypes.CDLL(None)
libc.on_exit(ctypes.cast(getattr(libc, "raise"), ctypes.c_void_p), None)
p = Preemption().install()
if sys.argv[1] == "ignore":
    p.ignore()
sys.exit(int(sys.argv[2]))
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="on_exit is glibc's")


def run_child(mode: str, signum: int) -> int:
    return subprocess.run([sys.executable, "-c", CHILD, mode, str(signum)], timeout=60).returncode


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_a_late_preemption_signal_kills_a_finalizing_rank_that_still_handles_it(signum):
    # the failure Preemption.ignore exists for: Python's handler is gone once the interpreter finalized
    assert run_child("handle", signum) == -signum


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_after_ignore_a_late_preemption_signal_leaves_the_exit_status_alone(signum):
    assert run_child("ignore", signum) == signum


def test_a_signal_before_ignore_is_noted_once():
    from gyre_hpc.live.preempt import Preemption

    calls = []
    p = Preemption(on_signal=lambda: calls.append(1)).install()
    try:
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGTERM)
        assert (p.signal, calls) == ("SIGUSR1", [1])
    finally:
        p.ignore()
        for s in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("protected", [False, True])
def test_a_service_process_ignores_the_preemption_signal_from_its_first_instruction(protected):
    """Engines and the proxy are spawned with ``ignore_preemption_signal``: a SIGUSR1 that mpirun or srun delivers
    while the service is still starting up (before serving.py runs) leaves it alive."""
    from gyre_hpc.engines.launch import ignore_preemption_signal

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"],
                            preexec_fn=ignore_preemption_signal if protected else None)
    proc.send_signal(signal.SIGUSR1)  # at once: the interpreter is still starting
    assert proc.wait(60) == (0 if protected else -signal.SIGUSR1)
