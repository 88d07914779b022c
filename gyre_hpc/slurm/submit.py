"""``gyre_hpc.submit``: submit a live training run with submitit from Python (a notebook), and a handle on it.

::

    run = gyre_hpc.submit("configs/local_4node.yaml", **{"allocator.steps": 2})    # or allocator__steps=2
    run.state              PENDING / RUNNING / COMPLETED / FAILED / CANCELLED / TIMEOUT / ...
    run.tail(5)            the last 5 events of RUN_DIR/events.jsonl, one line each
    run.result()           the summary dict (RUN_DIR/summary.json); JobError with the job's stderr tail if it failed

SLURM when ``srun`` is on PATH (``executor="auto"``): one allocation, 1 + K submitit tasks started by
``srun --mpi=pmix`` as one MPI world (gyre_hpc.slurm.jobspec); each task takes its rank from
``submitit.JobEnvironment()`` (gyre_hpc.slurm.submit_tasks.train_rank). Otherwise submitit's local executor
runs ``gyre train``'s mpirun launcher. docs/submitit.md.

Invariants
- The config (file, overrides) is loaded and checked, the policy and the layout validated, before anything is
  written or submitted: bad input raises ``ConfigError`` / ``LayoutError`` and leaves no run directory.
- The job runs the validated config: RUN_DIR/config.yaml is written before submission and the job loads it.
- ``RunHandle.state`` uses SLURM's words on both executors (the local executor's FINISHED becomes COMPLETED or
  FAILED from the job's result).
"""
from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any, Mapping, Sequence

from gyre_hpc.clock import wait_until
from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError, GyreError
from gyre_hpc.files.io import atomic_write_text
from gyre_hpc.models import run_init
from gyre_hpc.rundir import RunDir
from gyre_hpc.slurm import jobspec
from gyre_hpc.sweep import error_tail

EXECUTORS = ("auto", "slurm", "local")


class JobError(GyreError):
    """A submitted job failed, was cancelled or timed out (the message ends with its stderr tail)."""


def executor_kind(requested: str) -> str:
    """``auto`` -> ``slurm`` where ``srun`` is on PATH (as submitit decides), else ``local``."""
    if requested not in EXECUTORS:
        raise ConfigError(f"executor {requested!r} is not one of {', '.join(EXECUTORS)}")
    has_slurm = shutil.which("srun") is not None and shutil.which("sbatch") is not None
    if requested == "slurm" and not has_slurm:
        raise GyreError("executor 'slurm': srun/sbatch not found on PATH; submit from a SLURM login node, start "
                        "the local cluster (scripts/local-slurm.sh start), or use executor='local'")
    return requested if requested != "auto" else ("slurm" if has_slurm else "local")


def make_executor(kind: str, folder: Path, params: Mapping[str, Any]):
    import submitit

    ex = submitit.AutoExecutor(folder=folder, cluster=kind)
    ex.update_parameters(**params)
    return ex


def override_list(overrides: Mapping[str, Any] | Sequence[str] | None, dotted: Mapping[str, Any]) -> list[str]:
    """``{"allocator.steps": 2}``, ``["allocator.steps=2"]`` and ``allocator__steps=2`` -> ``["allocator.steps=2"]``.
    Values are written as JSON (a YAML subset), so None, lists and strings keep their type."""
    out = list(overrides) if isinstance(overrides, (list, tuple)) else []
    items = dict(overrides) if isinstance(overrides, Mapping) else {}
    for key, value in dotted.items():
        if "." not in key and "__" not in key:
            raise ConfigError(f"submit() got an unknown keyword {key!r}; config overrides are dotted keys: "
                              f"**{{'allocator.steps': 2}}, allocator__steps=2 or overrides={{...}}")
        items[key.replace("__", ".")] = value
    return out + [f"{k}={json.dumps(list(v) if isinstance(v, tuple) else v)}" for k, v in items.items()]


def submit(config: str | Path | None, overrides: Mapping[str, Any] | Sequence[str] | None = None, *,
           executor: str = "auto", timeout_min: int | None = None, **dotted: Any) -> "RunHandle":
    """Submit a live training run of ``config`` (a YAML path; None = the defaults) with ``overrides``."""
    from gyre_hpc.slurm.layout import preflight
    from gyre_hpc.slurm.submit_tasks import train_local

    sets = override_list(overrides, dotted)
    cfg = load_config(config, sets)
    preflight(cfg)  # before any file is written
    kind = executor_kind(executor)
    run_dir, cfg = run_init.new_run(cfg, "gyre_hpc.submit", absolute=True)  # resolved: what a requeue checks
    config_path = RunDir(run_dir).config_path
    params = (jobspec.train_parameters(cfg, run_dir) if kind == "slurm" else jobspec.single_task_parameters(cfg))
    if timeout_min:
        params["timeout_min"] = timeout_min
    ex = make_executor(kind, run_dir / "submitit", params)
    if kind == "slurm":
        from gyre_hpc.slurm.submit_requeue import TrainRank

        fn = TrainRank()  # requeued, and resumed from RUN_DIR/resume, when it is preempted
    else:
        fn = train_local
    job = ex.submit(fn, str(config_path), str(run_dir))
    atomic_write_text(run_dir / "job_id", f"{job.job_id}\n")
    return RunHandle(job, run_dir, kind)


def normal_state(raw: str, kind: str, has_result: bool | None = None) -> str:
    """SLURM's state words for both executors (``CANCELLED by 0`` -> CANCELLED; local FINISHED -> COMPLETED or
    FAILED by the result file, INTERRUPTED -> CANCELLED)."""
    word = (raw or "UNKNOWN").split()[0].upper()
    if kind == "local":
        word = {"FINISHED": "COMPLETED" if has_result else "FAILED", "INTERRUPTED": "CANCELLED"}.get(word, word)
    return word


class RunHandle:
    """A submitted run: its state, its event log while it runs, its summary when it ends."""

    def __init__(self, job, run_dir: Path, kind: str):
        self.job, self.run_dir, self.executor = job, Path(run_dir), kind
        self._cancelled = False

    def __repr__(self) -> str:
        return f"RunHandle(job {self.job_id} on {self.executor}, {self.state}, {self.run_dir})"

    @property
    def job_id(self) -> str:
        return str(self.job.job_id)

    @property
    def state(self) -> str:
        if self.executor != "local":  # ask sacct now (submitit's own .state may be a minute old)
            return normal_state(self.job.watcher.get_state(self.job_id, mode="force"), self.executor)
        raw = self.job.state
        outcome = self._local_outcome() if raw.upper() == "FINISHED" else None
        state = normal_state(raw, "local", outcome)
        return "CANCELLED" if self._cancelled and state == "FAILED" else state

    def _local_outcome(self) -> bool:
        """Did the finished local job return (rather than raise)? submitit's result pickle says."""
        import pickle

        path = self.job.paths.result_pickle
        if not path.exists():
            return False
        with open(path, "rb") as f:
            return pickle.load(f)[0] == "success"

    def done(self) -> bool:
        return self.job.done()

    def events(self, tail: int | None = None) -> list[dict[str, Any]]:
        """The run's event records so far (the last ``tail`` of them); [] before the allocator has started."""
        from gyre_hpc.allocator.eventlog import read_events

        path = self.run_dir / "events.jsonl"
        records = read_events(path) if path.is_file() else []
        return records[-tail:] if tail else records

    def tail(self, n: int = 10) -> str:
        """The last ``n`` events, one line each: ``t event key=value ...``."""
        lines = []
        for r in self.events(tail=n):
            rest = " ".join(f"{k}={json.dumps(v)}" for k, v in r.items() if k not in ("t", "wall", "event"))
            lines.append(f"{r.get('t', 0):9.2f}s {r['event']:<14} {rest}"[:200])
        return "\n".join(lines)

    def result(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the end and return the summary (summary.json); ``JobError`` if the job did not complete,
        ``TimeoutError`` if it is still running after ``timeout_s`` (the job keeps running)."""
        import submitit

        if timeout_s is not None and not wait_until(self.job.done, timeout_s, poll_s=1.0):
            raise TimeoutError(f"job {self.job_id} is still {self.state} after {timeout_s} s")
        try:
            return self.job.results()[0]  # rank 0's: the other ranks return None
        except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as exc:
            raise JobError(f"job {self.job_id} ({self.state}) of run {self.run_dir} failed: "
                           f"{error_tail(str(exc), lines=6, width=1500)}") from None

    def cancel(self) -> None:
        """scancel on SLURM; locally SIGTERM, which ``gyre train``'s launcher turns into a preemption: the ranks
        stop in order and save RUN_DIR/resume (``gyre train CONFIG --resume RUN_DIR`` continues) once the run
        has started (submitit's own SIGINT is followed by SIGKILL after 1 s, which would orphan mpirun)."""
        self._cancelled = True
        if self.executor == "local" and getattr(self.job, "_process", None) is not None:
            self.job._process.send_signal(signal.SIGTERM)
        else:
            self.job.cancel()
