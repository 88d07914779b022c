"""Formats of the ``slurm`` config section, checked when the config loads (``SlurmConfig.check``).

It sits below ``config`` (standard library and ``errors`` only), so that config never imports the ``slurm``
package; the renderer (``slurm.sbatch``, ``slurm.jobspec``) reads the same formats from here.

Invariants (each violation is a ``FieldError`` on the field, which the loader reports as ``slurm.<key>``)
- ``time`` is ``HH:MM:SS`` with minutes and seconds below 60 and a positive total.
- ``signal`` is ``SIG@seconds`` with a signal name SLURM knows and 0 <= seconds <= 65535.
- Every ``extra`` entry is ``--key=value`` or ``--flag`` with ``key`` in ``EXTRA_OPTIONS``; an option the renderer
  writes itself (nodes, time, signal, ...) is rejected with the ``slurm.*`` / ``cluster.*`` field that sets it;
  any other is rejected with the list of valid ones.
- ``exports`` are ``NAME=VALUE`` with a shell variable name; ``mem`` is a number with an optional K/M/G/T unit.
"""
from __future__ import annotations

import re
from typing import Protocol, Sequence

from gyre_hpc.errors import require

#: sbatch options accepted in ``slurm.extra`` (long names, as in ``man sbatch``).
EXTRA_OPTIONS = (
    "acctg-freq", "begin", "comment", "constraint", "contiguous", "core-spec", "cpu-freq", "cpus-per-gpu",
    "deadline", "dependency", "exclude", "exclusive", "get-user-env", "gpu-bind", "gpu-freq",
    "gres", "gres-flags", "hint", "licenses", "mail-type", "mail-user", "mem-bind", "mem-per-cpu", "mem-per-gpu",
    "network", "nice", "no-kill", "nodelist", "open-mode", "power", "prefer", "priority", "profile", "qos",
    "reservation", "sockets-per-node", "spread-job", "switches", "thread-spec", "threads-per-core", "tmp",
    "use-min-nodes", "wckey",
)

#: sbatch options the renderer writes from the config: the field to set instead.
OWNED_OPTIONS = {
    "nodes": "cluster.cells x cluster.nodes_per_cell", "ntasks-per-node": "the layout (one task per node)",
    "ntasks": "the layout", "gpus-per-node": "cluster.gpus_per_node", "time": "slurm.time",
    "signal": "slurm.signal", "requeue": "slurm.requeue", "no-requeue": "slurm.requeue",
    "output": "slurm.output", "error": "slurm.error", "job-name": "slurm.job_name",
    "partition": "slurm.partition", "account": "slurm.account", "cpus-per-task": "slurm.cpus_per_task",
    "mem": "slurm.mem", "export": "slurm.exports",
}

#: signal names sbatch --signal accepts (without the SIG prefix).
SIGNALS = ("HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT", "STOP", "TSTP",
           "TTIN", "TTOU", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO", "PWR")

_TIME = re.compile(r"(\d+):(\d{2}):(\d{2})")
_SIGNAL = re.compile(r"(?:SIG)?([A-Z0-9]+)@(\d+)")
_EXTRA = re.compile(r"--([a-z][a-z0-9-]*)(?:=(.+))?")
_EXPORT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
_MEM = re.compile(r"\d+[KMGT]?")


def time_seconds(text: str) -> int:
    """``"48:00:00"`` -> 172800; ``ValueError`` naming the expected form otherwise."""
    m = _TIME.fullmatch(text)
    if not m or int(m.group(2)) >= 60 or int(m.group(3)) >= 60:
        raise ValueError(f"{text!r} is not HH:MM:SS (minutes and seconds below 60), e.g. 48:00:00")
    total = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
    if total == 0:
        raise ValueError(f"{text!r} is zero; give a positive time limit")
    return total


def parse_signal(text: str) -> tuple[str, int]:
    """``"USR1@300"`` -> ("USR1", 300)."""
    m = _SIGNAL.fullmatch(text)
    if not m or m.group(1) not in SIGNALS or int(m.group(2)) > 65535:
        raise ValueError(f"{text!r} is not SIG@seconds with SIG one of {', '.join(SIGNALS)} and seconds "
                         f"<= 65535, e.g. USR1@300")
    return m.group(1), int(m.group(2))


def check_extra(entry: str) -> None:
    m = _EXTRA.fullmatch(entry)
    if not m:
        raise ValueError(f"{entry!r} is not --key=value or --flag")
    key = m.group(1)
    if key in OWNED_OPTIONS:
        raise ValueError(f"--{key} is written from the config: set {OWNED_OPTIONS[key]} instead")
    if key not in EXTRA_OPTIONS:
        raise ValueError(f"--{key} is not an accepted sbatch option; valid: {', '.join(EXTRA_OPTIONS)}")


class SlurmFields(Protocol):
    """What ``check_slurm`` reads of ``config.SlurmConfig`` (this module sits below ``config``)."""

    time: str
    signal: str
    extra: Sequence[str]
    exports: Sequence[str]


def check_slurm(cfg: SlurmFields) -> None:
    """``SlurmConfig.check``: every format above, as ``FieldError`` on the offending field."""
    for key, fn in (("time", time_seconds), ("signal", parse_signal)):
        try:
            fn(getattr(cfg, key))
        except ValueError as exc:
            require(False, key, str(exc))
    for i, entry in enumerate(cfg.extra):
        try:
            check_extra(entry)
        except ValueError as exc:
            require(False, f"extra[{i}]", str(exc))
    for i, entry in enumerate(cfg.exports):
        require(bool(_EXPORT.fullmatch(entry)), f"exports[{i}]", f"{entry!r} is not NAME=VALUE")
    require(cfg.mem is None or bool(_MEM.fullmatch(cfg.mem)), "mem", f"{cfg.mem!r} is not a number with an "
            "optional unit K, M, G or T, e.g. 512G")
    require(cfg.cpus_per_task >= 1, "cpus_per_task", f"must be >= 1, got {cfg.cpus_per_task}")
    require(cfg.max_requeues >= 0, "max_requeues", f"must be >= 0, got {cfg.max_requeues}")
    for key in ("job_name", "output", "error", "python"):
        value = getattr(cfg, key)
        require(bool(value.strip()) and not any(c in value for c in "\n\"'"), key,
                f"{value!r} must be non-empty, one line, without quotes")
    for i, line in enumerate(cfg.setup):
        require("\n" not in line, f"setup[{i}]", "must be one line (give several entries instead)")
