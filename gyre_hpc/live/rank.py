"""One rank of a live run: the dispatch every rank goes through, however it was started.

::

    gyre train CONFIG (mpirun, gyre_hpc.live.launch)  |  srun ... gyre train CONFIG  |  submitit (slurm.submit_tasks)
      └─ run_rank(cfg, args, preemption)
           rank 0           allocator server + proxy + harness + data-plane hub   (gyre_hpc.live.root.run_root)
           cell c worker 0  the cell runner of cell c: engines ⇄ trainer          (gyre_hpc.live.cell_runner)
           cell c worker i  follows its leader's trainer calls                   (gyre_hpc.live.workers.follow)
           the allocator and the leaders form the control world (ranks 0..K) on which everything below runs

Invariants
- The preemption signals are caught from the first moment (``early_preemption``, before the config, the heavy
  imports and MPI_Init); a rank ``gyre train`` launched (``LAUNCHED_ENV``) learns of a preemption from
  RUN_DIR/preempt.request only, and leaves the signals their default action.
- Under the sbatch script (``SBATCH_ENV``) the ranks watch RUN_DIR/preempt.request too, and rank 0 takes a SIGTERM
  for srun's teardown after a lost rank (exit 69, ``lost_rank_saved``) unless the script's request file comes
  within ``lost.REQUEST_GRACE_S`` (``lost.SrunTeardown``); SIGUSR1 stays a preemption. Ranks srun started without
  the script (by hand, submitit) take both signals for a preemption; submitit's tasks also the signal submitit
  asks SLURM for before the time limit (USR2; their stack dump moves to SIGQUIT: ``gyre_hpc.lifecycle.rank_signals``).
- Everything a rank checks (run directory, resume config, resume files) is checked before MPI starts, alike on
  every rank, so a bad start fails every rank the same way instead of hanging a collective.
- The config a rank runs with is resolved once (``_shared_initial_model``: the run's initial model, RUN_DIR/model/init,
  once it exists on every rank) and handed down as it is; rank 0 writes it to RUN_DIR/config.yaml only when no one
  did (``gyre_hpc.rundir.RunDir.keep_config``: srun's ranks of a plain sbatch script) and never rewrites it.
- A rank that raises ends the whole MPI world (MPI_Abort) after writing RUN_DIR/errors/rankN.txt: no hang.
- The exit status is 0, or ``gyre_hpc.lifecycle.recovery.PREEMPTED_EXIT`` when the run was preempted and its resume state
  saved; rank 0 prints the summary (``print_summary``) unless preempted.
- The placement of a rank inside a SLURM step is checked by the caller (jobs/train.py, slurm/submit_tasks.py):
  this package never imports ``gyre_hpc.slurm``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

from gyre_hpc.config import GyreConfig, to_dict
from gyre_hpc.errors import ConfigError, GyreError
from gyre_hpc.lifecycle.recovery import PREEMPTED_EXIT, SBATCH_ENV, OutcomeKind
from gyre_hpc.live.launch import LAUNCHED_ENV
from gyre_hpc.rundir import RunDir


def early_preemption(rank: bool):
    """Catch the preemption signals from the first moment. A rank under SLURM (srun, scancel signal the step)
    notes them (live.preempt.Preemption); a rank ``gyre train`` launched leaves them their default action
    (its preemption comes as RUN_DIR/preempt.request; a signal there is mpirun ending the job); the launcher
    notes one that comes before mpirun starts (``launch`` then forwards the later ones)."""
    from gyre_hpc.lifecycle import early_signals
    from gyre_hpc.live.preempt import SIGNALS, Preemption

    if rank and os.environ.get(LAUNCHED_ENV):
        return Preemption()
    if rank:
        pending = Preemption().install()
    else:
        pending = Preemption()
        for s in SIGNALS:
            signal.signal(s, lambda signum, frame: pending.request(signal.Signals(signum).name))
    if early_signals.received:  # it came while the interpreter imported this job (gyre_hpc/cli.py armed it)
        pending.request(early_signals.received[0])
    return pending


def check_resume_config(cfg: GyreConfig, run_dir: Path) -> None:
    """A resume continues the run in ``run_dir``: its config may differ from RUN_DIR/config.yaml only in the keys
    ``gyre_hpc.lifecycle.resume.may_change`` allows (steps, run directory name, timeouts, retries, slurm.*)."""
    from gyre_hpc.lifecycle import resume

    rundir = RunDir(run_dir)
    saved = rundir.saved_config() if resume.exists(run_dir) else None
    if saved is None:
        return
    path = rundir.config_path
    changes = resume.config_changes(saved, to_dict(cfg), to_dict(GyreConfig()))
    if changes:
        listed = "; ".join(f"{k}: {old!r} there, {new!r} now" for k, (old, new) in changes.items())
        raise ConfigError(f"{path}: resuming this run with a different config ({listed}); resume with the run's "
                          f"config and --set options (only allocator.steps, run.name/out_dir, timeouts, retries, "
                          f"slurm.* and the cells' workers and tensor_parallel may change)")


def run_rank(cfg: GyreConfig, args: argparse.Namespace, preemption=None) -> int:
    """One rank of the live run: rank 0 drives, the others run their cell. ``preemption`` was installed before
    anything heavy (``early_preemption``; installed here for a caller that has not: the submitit task)."""
    if preemption is None:
        preemption = early_preemption(rank=True)
    if not args.run_dir:
        raise ConfigError("inside an MPI world, gyre train needs --run-dir (the launcher sets it)")
    from gyre_hpc.lifecycle.recovery import REQUEST_FILE

    rundir = RunDir.at(args.run_dir)
    run_dir = rundir.path
    from gyre_hpc.lifecycle import resume
    from gyre_hpc.models import run_init

    if os.environ.get(LAUNCHED_ENV) or os.environ.get(SBATCH_ENV):  # a launcher writes the request file
        preemption.watch(run_dir / REQUEST_FILE)
    # every rank alike, before MPI starts; a resumed run has its initial model (the launcher's, or rank 0's)
    check_resume_config(run_init.for_run(cfg, run_dir), run_dir)
    _check_resume_files(run_dir)
    from gyre_hpc.allocator.mpi_transport import MpiTransport
    from gyre_hpc.clock import WallClock
    from gyre_hpc.live.dataplane import open_data_comm
    from gyre_hpc.live.workers import split_world

    worlds = split_world(cfg.cluster)  # collective over the whole world (every worker of every cell)
    if not worlds.role.in_control:
        return _follow(worlds, run_dir, preemption)
    transport = MpiTransport(1 + cfg.cluster.cells, comm=worlds.control, clock=WallClock(_last_event_t(cfg, run_dir)))
    _traceback_on_signal(run_dir / "traces" / f"rank{worlds.role.rank}.txt")
    comm = open_data_comm(worlds.control)
    from gyre_hpc.live.secret import share_job_secret

    with _abort_world_on_error(worlds.role.rank, run_dir):
        share_job_secret(comm, run_dir)  # every listener of the job requires it (gyre_hpc/net/auth.py)
        cfg = _shared_initial_model(cfg, run_dir, comm, transport.rank)  # resolved once: handed down as it is
        try:
            if transport.rank == 0 and not resume.exists(run_dir):  # srun's ranks of a plain sbatch: what the
                rundir.keep_config(cfg)  # resume check reads (a launcher or the submitter wrote it already)
            return _role(cfg, args, run_dir, transport, comm, preemption, worlds)
        finally:
            preemption.ignore()  # a late signal must not kill this rank in MPI_Finalize (live/preempt.py)


def _follow(worlds, run_dir: Path, preemption) -> int:
    """A cell's worker other than its leader: the leader's trainer calls until it says stop (live/workers.py). A
    preemption reaches the leader (the control world), which ends its cell in order and then stops its workers."""
    from gyre_hpc.live.workers import follow

    _traceback_on_signal(run_dir / "traces" / f"rank{worlds.role.rank}.txt")
    with _abort_world_on_error(worlds.role.rank, run_dir):
        try:
            follow(worlds.cell)
        finally:
            preemption.ignore()
    return 0


def _shared_initial_model(cfg: GyreConfig, run_dir: Path, comm, rank: int):
    """Ranks started without the launcher (srun, submitit) on a new run: rank 0 writes RUN_DIR/model/init (if the
    launcher has not), the others wait for it (a broadcast), then every rank derives the same config. ``cfg`` is
    the config as loaded, alike on every rank, so every rank takes the same branch."""
    from gyre_hpc.models import run_init

    if not run_init.wanted(cfg.model):
        return cfg
    if rank == 0:
        run_init.materialise(cfg, run_dir)
    comm.bcast(None, root=0)
    return run_init.for_run(cfg, run_dir)


def _check_resume_files(run_dir: Path) -> None:
    """A rank started on a RUN_DIR with a resume state (the requeued SLURM job): every file it needs is there,
    checked before MPI starts (a ``CheckpointError`` naming the first one missing, alike on every rank)."""
    from gyre_hpc.lifecycle import resume

    if resume.exists(run_dir):
        resume.check_files(run_dir, resume.load(run_dir))


def _last_event_t(cfg: GyreConfig, run_dir: Path) -> float:
    """Where a segment's time line starts: after the last event of the earlier segments (0 for a new run). A new
    run has events already when its first segment was torn down while it started and it was relaunched
    (live/supervise.py, ``rank_lost_at_start``): its time line goes on after them too."""
    from gyre_hpc.allocator.eventlog import read_events

    path = run_dir / cfg.allocator.events_file
    if not path.is_file():
        return 0.0
    try:
        return max((float(e.get("t", 0.0)) for e in read_events(path)), default=0.0) + 1e-3
    except (GyreError, ValueError, TypeError):
        return 0.0


@contextlib.contextmanager
def _abort_world_on_error(rank: int, run_dir: Path | None = None):
    """A rank that raises ends the whole MPI world at once (MPI_Abort), after printing why: otherwise the
    other ranks wait for it in a collective (or MPI_Finalize's fence) and the job hangs instead of failing."""
    try:
        yield
    except BaseException:
        import traceback

        from mpi4py import MPI

        print(f"gyre train: rank {rank} failed; ending the MPI world", file=sys.stderr)
        exc = sys.exc_info()[1]
        if run_dir is not None and not isinstance(exc, KeyboardInterrupt):  # the launcher reports it as "error"
            record_error(run_dir, rank, exc)
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def record_error(run_dir: Path, rank: int | str, exc: BaseException) -> None:
    """RUN_DIR/errors/rankN.txt: why rank N failed (read by the launchers: ``gyre train`` reports the run as an
    error, the batch script's relaunch helper never takes the step for a lost rank); best effort."""
    with contextlib.suppress(OSError):
        (run_dir / "errors").mkdir(exist_ok=True)
        (run_dir / "errors" / f"rank{rank}.txt").write_text(f"{type(exc).__name__}: {exc}\n")


def _role(cfg: GyreConfig, args: argparse.Namespace, run_dir: Path, transport, comm, preemption, worlds) -> int:
    if transport.rank == 0:
        from gyre_hpc.live.root import run_root

        out = run_root(cfg, run_dir, transport, comm, preemption, _teardown(run_dir, preemption))
        if out.kind is OutcomeKind.RANK_LOST:
            print(f"gyre train: rank 0: {out.reason}; resume state: {out.resume or out.error}",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(out.exit)  # MPI_Finalize would wait for the rank that is gone
        if out.kind is OutcomeKind.PREEMPTED and out.resume is None:
            raise GyreError(f"preempted ({out.reason}), but the resume state could not be saved: "
                            f"{out.error}; the last checkpoint is {run_dir / 'checkpoints' / 'latest'}")
        preempted = out.kind is OutcomeKind.PREEMPTED
        if not preempted:
            print_summary(dict(out.summary or {}), args.json)  # the job's output ends with the summary
        if out.failed:  # stopped in order, but failed (data loss): the step fails
            return 1
    else:
        from gyre_hpc.live.cell_runner import CellRunner
        from gyre_hpc.live.workers import Orders
        from gyre_hpc.replicas import leader_replicas

        proxy_url = comm.bcast(None, root=0)
        orders = Orders(worlds.cell, cfg.cluster, worlds.hosts) if worlds.size > 1 else None
        runner = CellRunner(run_dir, transport, comm, proxy_url, preemption, allocator=cfg.allocator,
                            engine=cfg.engine, model=cfg.model, train=cfg.train, transfer=cfg.transfer,
                            proxy=cfg.proxy, seed=cfg.run.seed, batch_groups=cfg.scheduler.batch_groups,
                            orders=orders, replicas=leader_replicas(cfg.cluster, cfg.engine))
        runner.run()
        preempted = runner.preempted
    return PREEMPTED_EXIT if preempted else 0


def _teardown(run_dir: Path, preemption):
    """Rank 0's SIGTERM handler where a launcher writes RUN_DIR/preempt.request (gyre_hpc.live.lost): under
    ``gyre train`` a SIGTERM is mpirun tearing the job down (a rank died); under the sbatch script it is srun's
    teardown unless the script's request comes within the grace. Elsewhere (srun by hand, submitit) None: the
    SIGTERM stays a preemption (``early_preemption``)."""
    from gyre_hpc.live import lost
    from gyre_hpc.lifecycle.recovery import REQUEST_FILE

    if os.environ.get(LAUNCHED_ENV):
        return lost.Teardown().install()
    if os.environ.get(SBATCH_ENV):
        return lost.SrunTeardown(preemption, run_dir / REQUEST_FILE).install().adopt()
    return None


def _traceback_on_signal(path: Path) -> None:
    """``kill -USR2 PID`` makes a rank append every thread's stack to ``path``: how to see where a hung rank is.
    ``gyre train`` signals every rank when it is interrupted (Ctrl-C, a second SIGTERM, a test's timeout).
    (SIGUSR1 is the preemption signal: live/preempt.py.) On submitit's SLURM tasks USR2 is the time-limit
    preemption and the dump is ``kill -QUIT PID`` (``gyre_hpc.lifecycle.rank_signals``, decided once per process)."""
    import faulthandler
    import signal

    from gyre_hpc.lifecycle import rank_signals

    path.parent.mkdir(parents=True, exist_ok=True)
    dump = signal.Signals[rank_signals.current().dump]
    faulthandler.register(dump, file=open(path, "a"), all_threads=True)  # noqa: SIM115 (kept open)


def print_summary(summary: dict, as_json: bool) -> None:
    """The run's summary: one JSON object with ``as_json``, else one line."""
    if as_json:
        print(json.dumps(summary))
        return
    rf, rl = summary.get("reward_first"), summary.get("reward_last")
    print(f"{summary['policy']}: {summary['steps']} steps in {summary['wall_s']:.0f}s, "
          f"switches r->t {summary.get('switches_r2t')} t->r {summary.get('switches_t2r')}, "
          f"reward {rf if rf is None else round(rf, 3)} -> {rl if rl is None else round(rl, 3)}, "
          f"staleness mean {summary.get('staleness_mean', 0):.2f} max {summary.get('staleness_max')}; "
          f"run directory {summary['run_dir']}")
