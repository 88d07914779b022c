"""gyre_hpc.lifecycle.early_signals: from ``arm()`` on, a preemption signal is noted instead of ending the process; ranks
that ``gyre train`` launched are left with the default action."""
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os, signal, sys
from gyre_hpc.lifecycle import early_signals
armed = early_signals.arm()
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.SIGUSR1)
print(armed, early_signals.received)
"""


def run_child(env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GYRE_LAUNCHED"}
    env.update(PYTHONPATH=str(ROOT), **env_extra)
    return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60)


def test_armed_signals_are_noted_in_order_and_the_process_goes_on():
    done = run_child({})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True ['SIGTERM', 'SIGUSR1']"


def test_a_rank_the_launcher_started_keeps_the_default_action():
    done = run_child({"GYRE_LAUNCHED": "1"})
    assert done.returncode == -signal.SIGTERM and done.stdout == ""
