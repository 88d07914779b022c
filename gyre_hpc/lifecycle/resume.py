"""The resume state of a preempted live run: what rank 0 holds that the core's checkpoint does not.

::

    RUN_DIR/resume/                    one directory, replaced whole (gyre_hpc.files.io.atomic_dir)
      state.json                       policy version, steps done, the staleness bookkeeping (SchedState
                                       counters + every step's lag record), the trajectory buffer (ready,
                                       untrained groups: gid, TITO file, token versions), run-level counters
      checkpoint/                      the core's checkpoint of that version (hard links of checkpoints/latest:
                                       weights, optimizer, version)

A preempted run (SIGTERM or the preemption signal on its ranks) writes it and exits with ``recovery.PREEMPTED_EXIT``;
a run started on a RUN_DIR that holds it (``gyre train CONFIG --resume RUN_DIR``, or the requeued SLURM job
whose RUN_DIR is named after the same job id) continues from it: same step numbering, same version, same
admission window. docs/runtime.md (Preemption and resume) describes the whole path.

Invariants (tests/unit/test_resume_state.py)
- The directory appears only complete: a process killed while writing it leaves the previous resume state
  (or none) in place, never a mix of two.
- ``load`` accepts only a state whose checkpoint holds the same version as state.json, with exactly
  ``steps_done`` step records and a ``lag_sum`` equal to the sum of those records' mean lags; anything else
  is a ``CheckpointError`` naming the file and the key.
- ``config_changes`` names every dotted key whose value differs between the run's config.yaml and the config
  of the resuming run, except the keys that may change across segments (``may_change``: the step count, the run
  directory's name, the relaunch budget, timeouts, retries, the sbatch section and the cells' inner layout:
  workers and tensor parallelism); a resume refuses any other
  difference. A key the saved config lacks (a gyre older than the key wrote it) is no difference while the
  resuming run keeps the key's default (``defaults``): a new key's default is the behaviour before it.
- ``save_empty`` writes a state of version 0 with no checkpoint (a preemption before any rank started); ``load``
  accepts a missing checkpoint only for it, and ``needed_files`` of a state lists every file a resume reads
  (state, checkpoint meta and each rank's files, the buffered groups' TITO files): ``check_files`` names the
  first one missing in one line, before any process starts.
- ``restore_sched`` gives the state the saved counters; the buffered groups count as ready and unprocessed,
  nothing is in flight: ``admission_window`` of the restored state equals the saved one.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gyre_hpc.allocator.state import SchedState
from gyre_hpc.errors import CheckpointError
from gyre_hpc.files.io import atomic_dir

FORMAT = 1
DIR, STATE, CHECKPOINT = "resume", "state.json", "checkpoint"
#: SchedState fields saved and restored: the policy version, step count and the staleness bookkeeping
SCHED_FIELDS = ("version", "steps_done", "trained_batches", "lag_sum", "admitted_queries")
#: saved too and restored when present (a state written before they existed lacks them): the token-weighted
#: staleness sums the admission window reads (``SchedState.measured_lag``, ``SchedState.feedback_lag``)
SCHED_TOKEN_FIELDS = ("lag_token_sum", "lag_tokens", "onpolicy_batches", "onpolicy_tokens")
BUFFER_KEYS = ("gid", "tito", "runs", "trained_tokens", "gen_versions")
#: the files of rank r in a checkpoint directory (gyre_hpc.train.checkpoint writes them; no pickle with globals)
RANK_FILES = ("rank{rank:03d}.safetensors", "rank{rank:03d}.state.pt")


#: config keys a resumed run may change: how many steps, where the run directory is, how long to wait, how the
#: job is submitted. Everything else (model, optimizer, cells, policy, workload, seed) must stay what it was.
MAY_CHANGE = ("allocator.steps", "allocator.preempt_inflight", "run.name", "run.out_dir", "run.max_relaunches",
              "run.resume_every_steps", "slurm.",
              # the cells' inner layout: a checkpoint is re-cut for another one (train.checkpoint.load_resharded)
              "cluster.tensor_parallel", "cluster.workers_per_node", "cluster.nodes_per_cell", "cluster.gpus_per_node")
MAY_CHANGE_SUFFIXES = ("timeout_s", "retries")


def may_change(key: str) -> bool:
    return key in MAY_CHANGE or key.startswith(tuple(k for k in MAY_CHANGE if k.endswith("."))) or \
        key.rsplit(".", 1)[-1].endswith(MAY_CHANGE_SUFFIXES)


def config_changes(saved: dict[str, Any], now: dict[str, Any],
                   defaults: dict[str, Any] | None = None) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (saved value, new value)}`` for every difference a resume must refuse (``may_change``);
    with ``defaults`` (the default config, nested), a key absent from ``saved`` and at its default now is none."""
    a, b, d = _flat(saved), _flat(now), _flat(defaults or {})
    keys = sorted(k for k in set(a) | set(b) if a.get(k, _ABSENT) != b.get(k, _ABSENT) and not may_change(k)
                  and not (k not in a and k in d and d[k] == b.get(k, _ABSENT)))
    return {k: (a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in keys}


_ABSENT = "<absent>"


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / DIR


def exists(run_dir: str | Path) -> bool:
    return (resume_dir(run_dir) / STATE).is_file()


def sched_snapshot(state: SchedState) -> dict[str, Any]:
    return {k: getattr(state, k) for k in SCHED_FIELDS + SCHED_TOKEN_FIELDS}


def save(run_dir: str | Path, state: dict[str, Any], checkpoint: str | Path) -> Path:
    """Write ``state`` and hard links of the checkpoint directory ``checkpoint`` as RUN_DIR/resume, atomically."""
    checkpoint = Path(checkpoint)
    meta = _checkpoint_version(checkpoint)
    if meta != state["version"]:
        raise CheckpointError(f"{checkpoint}: holds version {meta}, the resume state is version {state['version']}")
    with atomic_dir(resume_dir(run_dir)) as tmp:
        (tmp / CHECKPOINT).mkdir()
        for f in sorted(checkpoint.iterdir()):
            os.link(f, tmp / CHECKPOINT / f.name)  # the core replaces checkpoints/latest whole; links stay valid
        (tmp / STATE).write_text(json.dumps({"format": FORMAT, **state}, indent=1, sort_keys=True) + "\n")
    return resume_dir(run_dir)


def empty_state() -> dict[str, Any]:
    """The resume state of a run preempted before it began: step 0, nothing buffered, nothing to restore."""
    return {"version": 0, "sched": {"version": 0, "steps_done": 0, "trained_batches": 0, "lag_sum": 0.0,
                                    "admitted_queries": 0},
            "steps": [], "buffer": [], "next_gid": 0, "inflight": [],
            "counters": {"wall_s": 0.0, "runs_finished": 0, "groups": [], "build_errors": [], "segments": 1,
                         "proxy": {}}}


def save_empty(run_dir: str | Path) -> Path:
    """Write the empty resume state (no checkpoint: the resumed core starts from the config's seed)."""
    with atomic_dir(resume_dir(run_dir)) as tmp:
        (tmp / STATE).write_text(json.dumps({"format": FORMAT, **empty_state()}, indent=1, sort_keys=True) + "\n")
    return resume_dir(run_dir)


def has_checkpoint(run_dir: str | Path) -> bool:
    return (resume_dir(run_dir) / CHECKPOINT / "meta.json").is_file()


def needed_files(run_dir: str | Path, state: dict[str, Any]) -> list[Path]:
    """Every file a resume of ``run_dir`` with the loaded ``state`` reads."""
    ckpt = resume_dir(run_dir) / CHECKPOINT
    files = [resume_dir(run_dir) / STATE]
    if state["version"] > 0 or ckpt.exists():
        files.append(ckpt / "meta.json")
        try:
            world = int(json.loads((ckpt / "meta.json").read_text()).get("world_size", 1))
        except (OSError, ValueError, AttributeError):
            world = 1
        files += [ckpt / f.format(rank=r) for r in range(world) for f in RANK_FILES]
    files += [Path(g["tito"]) for g in state["buffer"] if g["trained_tokens"] > 0]
    return files


def check_files(run_dir: str | Path, state: dict[str, Any]) -> None:
    """A ``CheckpointError`` naming the first file a resume needs that is missing, empty or not of its format
    (a checkpoint's safetensors header, the zip container of its ``.state.pt``; the loader checks the rest)."""
    for f in needed_files(run_dir, state):
        if not f.is_file() or f.stat().st_size == 0:
            raise CheckpointError(f"{f}: {'missing' if not f.exists() else 'empty'}; the resume state of "
                                  f"{run_dir} is incomplete (restore the file, or start a new run)")
        why = _format_problem(f)
        if why:
            raise CheckpointError(f"{f}: {why}; the resume state of {run_dir} is damaged (restore the file, or "
                                  f"start a new run)")


def _format_problem(f: Path) -> str | None:
    """Why the checkpoint file ``f`` is not of its format (cheap: headers only), or None."""
    with open(f, "rb") as fh:
        head = fh.read(8)
        if f.name.endswith(".safetensors"):
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < n <= f.stat().st_size - 8:
                return "not a safetensors file (bad header length)"
            try:
                header = json.loads(fh.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError):
                return "not a safetensors file (its header is not JSON)"
            return None if isinstance(header, dict) else "not a safetensors file (its header is not an object)"
    if f.name.endswith(".state.pt") and not head.startswith(b"PK\x03\x04"):
        return "not a torch.save zip file"
    return None


def load(run_dir: str | Path) -> dict[str, Any]:
    """The checked resume state of ``run_dir`` (``CheckpointError`` naming file and key when it is not usable)."""
    path = resume_dir(run_dir) / STATE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no resume state (a run writes it when it is preempted)") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    _check(path, state)
    return state


def _check(path: Path, state: Any) -> None:
    need = {"format", "version", "sched", "steps", "buffer", "next_gid", "counters"}
    if not isinstance(state, dict) or not need <= set(state):
        raise CheckpointError(f"{path}: a resume state has the keys {sorted(need)}")
    if state["format"] != FORMAT:
        raise CheckpointError(f"{path}: format: {state['format']!r}, this gyre_hpc reads {FORMAT}")
    sched, steps = state["sched"], state["steps"]
    missing = [k for k in SCHED_FIELDS if k not in sched]
    if missing:
        raise CheckpointError(f"{path}: sched.{missing[0]} is missing")
    if not sched["version"] == state["version"] == len(steps) == sched["steps_done"]:
        raise CheckpointError(f"{path}: version: {state['version']}, sched.version {sched['version']}, "
                              f"sched.steps_done {sched['steps_done']} and {len(steps)} step records disagree")
    lag = sum(max(0.0, s["staleness_mean"]) for s in steps)
    if abs(lag - sched["lag_sum"]) > 1e-6 * max(1.0, lag) or sched["trained_batches"] != len(steps):
        raise CheckpointError(f"{path}: sched.lag_sum {sched['lag_sum']} / sched.trained_batches "
                              f"{sched['trained_batches']} do not match the {len(steps)} step records ({lag})")
    for i, g in enumerate(state["buffer"]):
        absent = [k for k in BUFFER_KEYS if k not in g]
        if absent:
            raise CheckpointError(f"{path}: buffer[{i}].{absent[0]} is missing")
    ckpt = path.parent / CHECKPOINT
    if state["version"] == 0 and not ckpt.exists():
        return  # the empty state (save_empty): the core starts from the config's seed
    if _checkpoint_version(ckpt) != state["version"]:
        raise CheckpointError(f"{ckpt}: holds version {_checkpoint_version(ckpt)}, {path} is version "
                              f"{state['version']}")


def _checkpoint_version(checkpoint: Path) -> int | None:
    try:
        return json.loads((checkpoint / "meta.json").read_text())["version"]
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return None


def restore_sched(state: SchedState, saved: dict[str, Any], buffered: int, backlog_work_s: float,
                  now: float, held: int = 0) -> None:
    """Give a fresh ``state`` the saved counters; ``buffered`` groups wait ready and unprocessed, ``held`` ready
    groups wait for the rest of their fixed batch (in flight to the policy, as before the preemption)."""
    for k in SCHED_FIELDS + tuple(k for k in SCHED_TOKEN_FIELDS if k in saved):
        setattr(state, k, type(getattr(state, k))(saved[k]))
    state.inflight_groups, state.step_groups = held, 0
    state.unprocessed_groups = buffered
    state.backlog_work_s = backlog_work_s
    state.set_ready(buffered, now)
