"""The SLURM environment of this process, read through one mapping table into a typed, frozen ``SlurmEnv``.

Every variable gyre_hpc reads is a row of ``VARIABLES`` (field, variables in precedence order, parser); no
other module calls ``os.environ["SLURM_..."]``.

Facts measured on the local cluster (scripts/local-slurm.sh, SLURM 22.05) that shape the fields:
- Inside a step (``srun``) ``SLURM_NODEID``, ``SLURM_PROCID``, ``SLURM_NTASKS`` and ``SLURM_TASKS_PER_NODE``
  describe the step, and ``SLURM_STEP_NODELIST`` its nodes; ``SLURM_NODELIST`` stays the job's node list.
  So ``nodes`` is the step's node list inside a step and the job's in the batch script.
- Emulated nodes share one hostname: a node is identified by ``SLURMD_NODENAME``, never ``gethostname()``.

Invariants (each raises ``SlurmEnvError`` naming the variable)
- ``job_nodes`` and ``step_nodes`` are expanded host lists without duplicates; their length equals
  ``SLURM_JOB_NUM_NODES`` / ``SLURM_STEP_NUM_NODES`` when those are set.
- ``nodes[node_id] == node_name``: ``SLURM_NODEID`` indexes the current node list.
- ``0 <= proc_id < ntasks`` and ``sum(tasks_per_node) == ntasks`` when both are set.
- ``len(tasks_per_node) == len(nodes)`` when set; a malformed value is an error, never a default.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Callable, Mapping

from gyre_hpc.errors import SlurmEnvError


def expand_hostlist(text: str) -> tuple[str, ...]:
    """``"n[1-3,7],gpu[01-02]"`` -> ``("n1", "n2", "n3", "n7", "gpu01", "gpu02")``.

    Ranges keep the zero padding of their lower bound (``[08-10]`` -> 08, 09, 10); several bracket groups in one
    name multiply (``r[1-2]n[1-2]`` -> r1n1, r1n2, r2n1, r2n2), as in ``scontrol show hostnames``.
    """
    hosts: list[str] = []
    for part in _split_top_level(text):
        names = [""]
        for literal, group in re.findall(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", part):
            names = [n + literal + s for n in names for s in (_expand_group(group, text) if group else [""])]
        hosts.extend(names)
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"host list {text!r} names a node twice")
    return tuple(hosts)


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ValueError(f"host list {text!r} has unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list {text!r} has unbalanced brackets")
    parts.append(text[start:])
    if any(not p.strip() for p in parts):
        raise ValueError(f"host list {text!r} has an empty name")
    return [p.strip() for p in parts]


def _expand_group(group: str, text: str) -> list[str]:
    out = []
    for item in group.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if not m:
            raise ValueError(f"host list {text!r}: {item!r} is not a number or a range a-b")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"host list {text!r}: range {item!r} runs backwards")
        out.extend(f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
    return out


def expand_counts(text: str) -> tuple[int, ...]:
    """``"2(x3),1"`` -> ``(2, 2, 2, 1)``: SLURM's compressed per-node counts (tasks, CPUs)."""
    out: list[int] = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise ValueError(f"{text!r}: {item!r} is not N or N(xM)")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return tuple(out)


def gpu_count(text: str) -> int:
    """``"4"`` or ``"a100:4"`` (SLURM_GPUS_PER_NODE) -> 4."""
    return int(text.rsplit(":", 1)[-1])


@dataclass(frozen=True)
class Var:
    field: str
    names: tuple[str, ...]
    parse: Callable[[str], object]


#: The one mapping table: field of SlurmEnv <- first set variable among ``names``, parsed.
VARIABLES: tuple[Var, ...] = (
    Var("job_id", ("SLURM_JOB_ID", "SLURM_JOBID"), int),
    Var("job_name", ("SLURM_JOB_NAME",), str),
    Var("job_nodes", ("SLURM_JOB_NODELIST", "SLURM_NODELIST"), expand_hostlist),
    Var("job_num_nodes", ("SLURM_JOB_NUM_NODES",), int),
    Var("step_id", ("SLURM_STEP_ID", "SLURM_STEPID"), int),
    Var("step_nodes", ("SLURM_STEP_NODELIST",), expand_hostlist),
    Var("step_num_nodes", ("SLURM_STEP_NUM_NODES",), int),
    Var("node_name", ("SLURMD_NODENAME",), str),
    Var("node_id", ("SLURM_NODEID",), int),
    Var("proc_id", ("SLURM_PROCID",), int),
    Var("local_id", ("SLURM_LOCALID",), int),
    Var("ntasks", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), int),
    Var("tasks_per_node", ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"), expand_counts),
    Var("cpus_per_node", ("SLURM_JOB_CPUS_PER_NODE",), expand_counts),
    Var("gpus_on_node", ("SLURM_GPUS_ON_NODE",), int),
    Var("gpus_per_node", ("SLURM_GPUS_PER_NODE",), gpu_count),
    Var("array_job_id", ("SLURM_ARRAY_JOB_ID",), int),
    Var("array_task_id", ("SLURM_ARRAY_TASK_ID",), int),
    Var("submit_dir", ("SLURM_SUBMIT_DIR",), str),
)


@dataclass(frozen=True)
class SlurmEnv:
    """What SLURM told this process; ``None`` where the variable was not set."""

    job_id: int
    job_name: str | None = None
    job_nodes: tuple[str, ...] = ()
    job_num_nodes: int | None = None
    step_id: int | None = None
    step_nodes: tuple[str, ...] = ()
    step_num_nodes: int | None = None
    node_name: str | None = None
    node_id: int | None = None
    proc_id: int | None = None
    local_id: int | None = None
    ntasks: int | None = None
    tasks_per_node: tuple[int, ...] = ()
    cpus_per_node: tuple[int, ...] = ()
    gpus_on_node: int | None = None
    gpus_per_node: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    submit_dir: str | None = None
    #: the variable each set field came from, for error messages
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def in_step(self) -> bool:
        """True inside ``srun`` (a job step), False in the batch script itself."""
        return bool(self.step_nodes)

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes ``node_id`` indexes: the step's inside a step, else the job's."""
        return self.step_nodes or self.job_nodes


def in_slurm(environ: Mapping[str, str] | None = None) -> bool:
    """True when this process runs inside a SLURM job (``SLURM_JOB_ID`` is set)."""
    environ = os.environ if environ is None else environ
    (job_id,) = [v for v in VARIABLES if v.field == "job_id"]
    return any(environ.get(name, "").strip() for name in job_id.names)


def from_environ(environ: Mapping[str, str] | None = None) -> SlurmEnv:
    """Parse ``environ`` (default ``os.environ``) through ``VARIABLES`` and check the invariants."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for var in VARIABLES:
        name = next((n for n in var.names if environ.get(n, "").strip()), None)
        if name is None:
            continue
        try:
            values[var.field] = var.parse(environ[name].strip())
        except ValueError as exc:
            raise SlurmEnvError(f"{name}={environ[name]!r} is malformed: {exc}") from None
        sources[var.field] = name
    if "job_id" not in values:
        raise SlurmEnvError("not inside a SLURM job: SLURM_JOB_ID is not set")
    env = SlurmEnv(**values, sources=sources)
    _check(env)
    return env


def _check(env: SlurmEnv) -> None:
    src = env.sources
    for nodes, count in (("job_nodes", "job_num_nodes"), ("step_nodes", "step_num_nodes")):
        n, c = getattr(env, nodes), getattr(env, count)
        if n and c is not None and len(n) != c:
            raise SlurmEnvError(f"{src[nodes]} names {len(n)} nodes but {src[count]}={c}")
    if env.node_id is not None and env.nodes:
        where = src["step_nodes" if env.in_step else "job_nodes"]
        if env.node_id >= len(env.nodes):
            raise SlurmEnvError(f"{src['node_id']}={env.node_id} is outside the {len(env.nodes)} nodes of {where}")
        if env.node_name is not None and env.nodes[env.node_id] != env.node_name:
            raise SlurmEnvError(f"{src['node_id']}={env.node_id} points at {env.nodes[env.node_id]!r} in {where}"
                                f" but SLURMD_NODENAME={env.node_name!r}")
    if env.ntasks is not None and env.proc_id is not None and not 0 <= env.proc_id < env.ntasks:
        raise SlurmEnvError(f"{src['proc_id']}={env.proc_id} is outside 0..{src['ntasks']}-1={env.ntasks - 1}")
    if env.tasks_per_node and env.ntasks is not None and sum(env.tasks_per_node) != env.ntasks:
        raise SlurmEnvError(
            f"{src['tasks_per_node']} sums to {sum(env.tasks_per_node)} but {src['ntasks']}={env.ntasks}")
    if env.tasks_per_node and env.nodes and len(env.tasks_per_node) != len(env.nodes):
        raise SlurmEnvError(
            f"{src['tasks_per_node']} has {len(env.tasks_per_node)} entries for {len(env.nodes)} nodes")
