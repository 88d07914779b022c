"""The preemption signals, caught from the first line of ``gyre train`` (stdlib only: armed before any import of
weight). Until ``jobs/train.py`` installs its own handlers (``gyre_hpc.live.rank.early_preemption``), SIGTERM
and SIGUSR1 are only noted in ``received``; the job then treats a noted signal as a preemption that came at once.

Invariants (tests/unit/test_early_signals.py)
- Once ``arm()`` returned, SIGTERM and SIGUSR1 no longer end the process; each one is appended to ``received``
  by name, in order.
- ``arm()`` leaves the handlers alone where ``skip_env`` is set (ranks ``gyre train`` launched keep the default
  action: a signal there is mpirun ending the job).
"""
from __future__ import annotations

import os
import signal

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
received: list[str] = []


def _note(signum, frame) -> None:
    received.append(signal.Signals(signum).name)


def arm(skip_env: str = "GYRE_LAUNCHED") -> bool:
    """Note the preemption signals from now on (True), unless ``skip_env`` is set in the environment (False)."""
    if os.environ.get(skip_env):
        return False
    for s in SIGNALS:
        signal.signal(s, _note)
    return True
