"""Where a run's listeners bind: ``cluster.listen_interface`` per launch path; pure (standard library only).

Some listeners of a run have no bind setting (mpirun's own, Open MPI's TCP BTL, Mooncake's handshake daemon): the
LD_PRELOAD shim ``gyre_hpc/native/bind_local.c`` moves their wildcard binds onto one interface's address
(``gyre_hpc.live.bind_local`` builds it and sets the environment of ``gyre train``'s mpirun). This module says
which interface, and renders the batch-script lines that do the same for the tasks of a SLURM step.

Invariants (tests/unit/test_listen.py)
- ``interface(None, one_machine)`` is ``"lo"`` exactly when the whole job runs on one machine (``gyre train``'s
  mpirun; ``slurm.local_cluster``), ``""`` (off) otherwise; ``""`` is off everywhere; a name is itself.
- ``batch_lines("")`` is empty: with the key off, a script has no trace of the shim.
- Service children (engines, the proxy) keep the interface only when it is ``lo`` (``services_keep``).
- The shim reaches only the step's tasks (srun's ``--export`` through ``SLURM_EXPORT_ENV``, after what sbatch's own
  ``--export`` put there, ``ALL`` if nothing), never the batch shell or srun itself: srun's own listeners stay where
  SLURM puts them.
- The lines never fail the script (``set -euo pipefail``): without the library (no C compiler) the step runs with
  wildcard listeners, and ``python -m gyre_hpc.live.bind_local`` has printed why on stderr.
"""
from __future__ import annotations

import shlex

#: the interface whose addresses the shim binds (read by bind_local.c in every process that loads it)
ENV = "GYRE_LISTEN_INTERFACE"
#: the interface of a job that runs on one machine
LOOPBACK = "lo"
#: Linux interface names are at most IFNAMSIZ - 1 bytes
MAX_NAME = 15


def interface(setting: str | None, one_machine: bool) -> str:
    """The interface listeners bind to for ``cluster.listen_interface = setting``; ``""`` means the shim is off."""
    if setting is None:
        return LOOPBACK if one_machine else ""
    return setting


def services_keep(name: str) -> bool:
    """Whether the engines and the proxy a rank starts keep the shim's interface ``name`` (else it is dropped from
    their environment and the inherited shim binds nothing there): only the loopback interface. Their own
    listeners bind ``engine.host`` / ``proxy.host``; their internal wildcard ones (torch's TCPStore, SGLang's) are
    reached at 127.0.0.1, which another interface's address would refuse."""
    return name == LOOPBACK


def name_error(name: str) -> str | None:
    """Why ``name`` cannot be an interface name (for the config's check), or None."""
    if name == "":
        return None
    if len(name.encode()) > MAX_NAME:
        return f"an interface name has at most {MAX_NAME} bytes, got {name!r}"
    if name in (".", "..") or any(c.isspace() or c in "/,=" or not c.isprintable() for c in name):
        return f"not an interface name: {name!r} (e.g. lo, eth0, ib0)"
    return None


def batch_lines(name: str, python: str) -> list[str]:
    """Batch-script lines (before srun) that give the step's tasks the shim bound to interface ``name``."""
    if not name:
        return []
    return [
        f"# --- listeners of the step's tasks bind {name}'s address (cluster.listen_interface): an LD_PRELOAD shim",
        "#     (gyre_hpc/native/bind_local.c) for what has no bind setting (Open MPI's TCP BTL, Mooncake); tasks only",
        f"export {ENV}={shlex.quote(name)}",
        f'GYRE_BIND_LOCAL="$({python} -m gyre_hpc.live.bind_local || true)"',
        'if [[ -n "$GYRE_BIND_LOCAL" ]]; then',
        '  export SLURM_EXPORT_ENV="${SLURM_EXPORT_ENV:-ALL},LD_PRELOAD=$GYRE_BIND_LOCAL${LD_PRELOAD:+:$LD_PRELOAD}"',
        "fi",
    ]
