"""Which signal means what to a rank of a live run, decided once at start-up from the environment (core: stdlib only).

::

    the rank's path (its environment)              preemption: save, exit 75   time limit   stack dump  services ignore
    submitit on SLURM (SUBMITIT_EXECUTOR=slurm)    SIGTERM SIGUSR1 + S         S            SIGQUIT [1] SIGUSR1 + S
    any other: gyre train's mpirun ranks, the      SIGTERM SIGUSR1             none         SIGUSR2     SIGUSR1
    sbatch script's srun ranks, srun by hand,
    submitit's local executor (gyre train inside)

    S = the signal submitit asks SLURM for before the time limit (its sbatch ``--signal=S@N``): submitit's
        ``JobEnvironment.USR_SIG``, read as submitit reads it (SUBMITIT_PREEMPT_SIGNAL, default USR2)
    [1] SIGUSR2 unless S is USR2 (the default): the dump takes the first of SIGUSR2, SIGQUIT that means nothing else

Why the submitit path moves its stack dump rather than share USR2: SLURM sends ``S`` to every process of the step
``N`` seconds before the limit, and a rank cannot tell it from a person's ``kill -USR2``; a missed warning is a job
killed at its limit and never requeued, a missed dump is only a missed dump. ``gyre train``'s launcher sends
SIGUSR2 to its ranks to dump their stacks when interrupted (live/launch.py), so on every other path the dump stays
SIGUSR2. No launcher sends a dump signal to submitit's tasks: there a person runs ``kill -QUIT PID`` (the JVM's
and Go's convention for a thread dump).

Services (engines, the proxy) ignore every preemption signal but SIGTERM: SLURM and srun signal every process of
the step, and the ranks, not their services, decide what a preemption does; SIGTERM still stops a service.

Invariants (tests/unit/test_rank_signals.py)
- A pure function of the environment (``decide``); a process decides once (``current``), before any handler.
- SIGTERM and SIGUSR1 are preemptions on every path; the dump signal is never a preemption signal.
- The time-limit signal is a preemption signal, and it is one only on the submitit path.
- ``S`` is the signal submitit's own sbatch asks for (the test renders submitit's script).
"""
from __future__ import annotations

import functools
import os
import signal
from dataclasses import dataclass
from typing import Mapping

from gyre_hpc.errors import ConfigError

#: submitit's sbatch script exports SUBMITIT_EXECUTOR=slurm to its srun step (the local executor: "local")
SUBMITIT_EXECUTOR_ENV = "SUBMITIT_EXECUTOR"
#: submitit's ``job_environment._PREEMPT_SIG_ENV``: the signal its sbatch asks for before the time limit
SUBMITIT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"
SUBMITIT_DEFAULT_SIGNAL = "USR2"
ALWAYS = ("SIGTERM", "SIGUSR1")
DUMP_CHOICES = ("SIGUSR2", "SIGQUIT")


@dataclass(frozen=True)
class RankSignals:
    """What each signal means to the ranks (and their services) of one path; names as ``signal.Signals``."""

    path: str
    """``submitit`` (submitit's SLURM tasks) or ``default`` (every other way a rank starts)."""
    preempt: tuple[str, ...]
    """A rank that gets one of these saves its resume state and exits 75 (``live/preempt.Preemption``)."""
    time_limit: str | None
    """The preemption signal that means the job's time limit is near (counts against submitit's timeout budget)."""
    dump: str
    """``kill -SIG PID`` appends every thread's stack of a rank to RUN_DIR/traces/rankN.txt."""

    @property
    def service_ignored(self) -> tuple[str, ...]:
        """What engines and the proxy ignore from their first instruction: the preemptions but SIGTERM."""
        return tuple(s for s in self.preempt if s != "SIGTERM")

    def nums(self, names: tuple[str, ...]) -> tuple[signal.Signals, ...]:
        return tuple(signal.Signals[n] for n in names)

    def is_time_limit(self, name: str | None) -> bool:
        return name is not None and name == self.time_limit


def submitit_signal(environ: Mapping[str, str]) -> str:
    """``SIGUSR2`` by default: the name submitit's ``JobEnvironment.USR_SIG`` gives, with the SIG prefix."""
    raw = environ.get(SUBMITIT_SIGNAL_ENV, SUBMITIT_DEFAULT_SIGNAL)
    name = "SIG" + raw
    if name not in signal.Signals.__members__:
        raise ConfigError(f"{SUBMITIT_SIGNAL_ENV}={raw!r} is not a signal name without SIG (e.g. USR2); submitit "
                          f"would refuse it too: unset it or give one such as USR2")
    return name


def decide(environ: Mapping[str, str]) -> RankSignals:
    """The signals of a rank whose environment is ``environ``."""
    if environ.get(SUBMITIT_EXECUTOR_ENV) != "slurm":
        return RankSignals("default", ALWAYS, None, DUMP_CHOICES[0])
    limit = submitit_signal(environ)
    preempt = ALWAYS + ((limit,) if limit not in ALWAYS else ())
    dump = next(s for s in DUMP_CHOICES if s not in preempt)
    return RankSignals("submitit", preempt, limit, dump)


@functools.lru_cache(maxsize=1)
def current() -> RankSignals:
    """This process's signals, decided once from its environment at the first call (a rank: ``early_preemption``;
    a service: ``engines.children`` before exec, and ``serving`` again)."""
    return decide(os.environ)
