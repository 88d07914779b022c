"""``gyre train``: reinforcement learning of the policy on the synthetic agent workload, with elastic cells.

::

    gyre train CONFIG            (not inside an MPI world or SLURM step)
      └─ mpirun --oversubscribe -n 1+K  python -m gyre_hpc.cli train CONFIG --run-dir RUN_DIR ...
           rank 0      allocator server + proxy + harness + data-plane hub   (gyre_hpc.live.root)
           rank c + 1  the cell runner of cell c: engine ⇄ trainer              (gyre_hpc.live.cell_runner)
      └─ prints the summary (summary.json of the run directory) as one JSON object with --json

Preemption: SIGTERM or SIGUSR1 to ``gyre train`` (or to the ranks: srun, scancel) saves the resume state and
every rank exits with status 75 (``gyre_hpc.resume.PREEMPTED_EXIT``); ``gyre train CONFIG --resume RUN_DIR``
continues the run at the same step, and so does any rank started on a RUN_DIR that holds a resume state (the
requeued SLURM job). A second SIGTERM, or Ctrl-C, interrupts instead (stacks in RUN_DIR/traces/).

The config is loaded and checked before any process starts. Inside an allocation, launch the ranks yourself
(``srun --mpi=pmix --ntasks=1+K gyre train CONFIG``): a rank of an MPI world runs its role directly.
``--sync`` runs the earlier synchronous loop (one engine, no cells, ``gyre_hpc.agents.closed_loop``).
The run directory layout and the summary keys are in docs/runtime.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gyre_hpc.config import load_config, to_dict
from gyre_hpc.errors import ConfigError, GyreError
from gyre_hpc.io import atomic_write_json, atomic_write_text, make_run_dir
from gyre_hpc.resume import PREEMPTED_EXIT
from gyre_hpc.slurm.sbatch import LOCAL_EXPORTS, SINGLE_HOST_EXPORTS
from jobs import add_overrides

DESCRIPTION = """\
Run RL training with elastic cells (rank 0 allocator + one rank per cell, launched with mpirun).

  gyre train configs/local.yaml
  gyre train configs/local.yaml --set allocator.steps=4 --set scheduler.policy=colocate --json

The run directory (run.out_dir/run.name-TIMESTAMP) holds config.yaml, events.jsonl, proxy-events.jsonl,
tito/, metrics.jsonl, weights/, checkpoints/, cells/, summary.json and roles.png, reward.png,
query_durations.png. --json prints the summary as one JSON object at the end.

Preemption: SIGTERM (or SIGUSR1) stops the run after the step in progress, saves RUN_DIR/resume (checkpoint,
trajectory buffer, staleness bookkeeping) and exits with status 75; then

  gyre train configs/local.yaml --resume RUN_DIR      continues at the same step (same --set options)
"""

MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK")
#: set by ``gyre train`` for the ranks it launches: they learn of a preemption from RUN_DIR/preempt.request,
#: never from a signal (a signal from mpirun means it is tearing the job down: a rank was lost)
LAUNCHED_ENV = "GYRE_LAUNCHED"
#: exit status of a run that lost a rank (EX_UNAVAILABLE) or ended on an unrecoverable error (EX_SOFTWARE)
RANK_LOST_EXIT, ERROR_EXIT = 69, 70


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config, e.g. configs/local.yaml")
    add_overrides(p, "allocator.steps=4")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")
    p.add_argument("--sync", action="store_true", help="the synchronous single-engine loop (no cells, no MPI)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a preempted run from RUN_DIR/resume (steps, version and staleness carry on)")
    p.add_argument("--run-dir", help=argparse.SUPPRESS)  # set by the launcher for the ranks
    p.add_argument("--dry-run", action="store_true",
                   help="print the layout and the launch commands; start nothing, touch no device")


def run(args: argparse.Namespace) -> int:
    live = not getattr(args, "dry_run", False) and not args.sync
    rank = live and any(k in os.environ for k in MPI_ENV)
    preemption = _early_preemption(rank) if live else None  # before the config, heavy imports and MPI_Init
    cfg = load_config(args.config, args.overrides)  # fails here, before any process starts
    _check_plugin_agent(cfg)
    if getattr(args, "dry_run", False):
        return _dry_run(cfg, args)
    if args.sync:
        return _sync(cfg, args)
    if rank:
        return _rank(cfg, args, preemption)
    from gyre_hpc.allocator.policies import validate

    validate(cfg.scheduler.policy, cfg.scheduler, cfg.cluster.cells)
    if getattr(args, "resume", None):
        run_dir = _resumable(cfg, Path(args.resume))
        if run_dir is None:
            return 0
    else:
        run_dir = make_run_dir(cfg.run.out_dir, cfg.run.name)
        try:
            atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
        except OSError as exc:
            shutil.rmtree(run_dir, ignore_errors=True)  # nothing half-written
            raise ConfigError(f"run.out_dir: cannot write {run_dir / 'config.yaml'} ({exc.strerror or exc}); "
                              f"free space or choose another directory with --set run.out_dir=DIR") from None
    if preemption.signal is not None:  # preempted before any rank started: the empty resume state
        from gyre_hpc import resume

        if not resume.exists(run_dir):
            resume.save_empty(run_dir)
        return _preempted(args, run_dir)
    code = launch(args, cfg.cluster.cells, run_dir, preemption)
    if code == PREEMPTED_EXIT:
        return _preempted(args, run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        return _failed(cfg, run_dir, code)
    summary = json.loads(summary_path.read_text())
    _print(summary, args.json)
    if summary.get("groups_lost"):
        print(f"gyre train: warning: {summary['groups_lost']} group(s) lost, their runs trained nothing (TITO "
              f"records missing, cut or inconsistent); see lost_groups in {summary_path}", file=sys.stderr)
    if summary.get("error"):
        raise GyreError(f"{summary['error']}; see {summary_path} and events.jsonl")
    return 0 if code == 0 else code


def _early_preemption(rank: bool):
    """Catch the preemption signals from the first moment. A rank under SLURM (srun, scancel signal the step)
    notes them (runtime.preempt.Preemption); a rank ``gyre train`` launched leaves them their default action
    (its preemption comes as RUN_DIR/preempt.request; a signal there is mpirun ending the job); the launcher
    notes one that comes before mpirun starts (``launch`` then forwards the later ones)."""
    from gyre_hpc import early_signals
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


def _failed(cfg, run_dir: Path, code: int) -> int:
    """mpirun ended without a summary and not preempted: an ``error`` event if a rank reported one (rank 0 writes
    it, and every rank that raises leaves RUN_DIR/errors/rankN.txt), else ``rank_lost``; one line, and the exit
    status of that kind."""
    from gyre_hpc.allocator.eventlog import read_events

    path = run_dir / cfg.allocator.events_file
    try:
        events = read_events(path) if path.is_file() else []
    except GyreError:
        events = []
    errors = sorted((run_dir / "errors").glob("rank*.txt")) if (run_dir / "errors").is_dir() else []
    if events and events[-1]["event"] == "error":
        kind, why = "error", events[-1].get("error", "")
    elif errors:
        kind, why = "error", f"{errors[0].stem}: {errors[0].read_text().strip().splitlines()[0][:300]}"
    else:
        kind, why = "rank_lost", f"a rank ended without finishing its role (mpirun exit {code})"
    if not events or events[-1]["event"] != "error":
        rec = {"t": max((e.get("t", 0.0) for e in events), default=0.0), "wall": round(time.time(), 6),
               "event": kind, "error": why, "mpirun_exit": code}
        with contextlib.suppress(OSError):
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
    print(f"gyre train: {kind}: {why}; the live run ended (mpirun exit {code}) without a summary; see {run_dir} "
          f"(events.jsonl, cells/, proxy.log, mpirun.log)", file=sys.stderr)
    return RANK_LOST_EXIT if kind == "rank_lost" else ERROR_EXIT


def _resumable(cfg, run_dir: Path) -> Path | None:
    """``--resume RUN_DIR``: the run directory, once its resume state and every file it needs have been checked
    (nothing in RUN_DIR is written before that); None when the run had finished (its summary is printed)."""
    from gyre_hpc import resume

    if not resume.exists(run_dir) and (run_dir / "summary.json").is_file():
        print(f"gyre train: {run_dir} has finished (summary.json, no resume state): nothing to resume",
              file=sys.stderr)
        return None
    if not resume.exists(run_dir):
        raise ConfigError(f"--resume {run_dir}: no resume state there ({resume.resume_dir(run_dir)}/state.json); "
                          f"a run writes it when it is preempted (SIGTERM/SIGUSR1)")
    check_resume_config(cfg, run_dir)
    state = resume.load(run_dir)
    resume.check_files(run_dir, state)
    done = state["sched"]["steps_done"]
    if done >= cfg.allocator.steps:
        raise ConfigError(f"allocator.steps: {cfg.allocator.steps}, but {run_dir} has {done} steps done; "
                          f"resume with --set allocator.steps=N for N > {done}")
    print(f"gyre train: resuming {run_dir} at step {done}", file=sys.stderr)
    return run_dir


def check_resume_config(cfg, run_dir: Path) -> None:
    """A resume continues the run in ``run_dir``: its config may differ from RUN_DIR/config.yaml only in the keys
    ``gyre_hpc.resume.may_change`` allows (steps, run directory name, timeouts, retries, slurm.*)."""
    from gyre_hpc import resume

    path = run_dir / "config.yaml"
    if not resume.exists(run_dir) or not path.is_file():
        return
    changes = resume.config_changes(yaml.safe_load(path.read_text()) or {}, to_dict(cfg))
    if changes:
        listed = "; ".join(f"{k}: {old!r} there, {new!r} now" for k, (old, new) in changes.items())
        raise ConfigError(f"{path}: resuming this run with a different config ({listed}); resume with the run's "
                          f"config and --set options (only allocator.steps, run.name/out_dir, timeouts, retries "
                          f"and slurm.* may change)")


def _preempted(args: argparse.Namespace, run_dir: Path) -> int:
    from gyre_hpc import resume

    state = resume.load(run_dir)  # fails (CheckpointError) if the ranks could not save it
    extra = "".join(f" --set {o}" for o in args.overrides)
    print(f"gyre train: preempted after {state['sched']['steps_done']} steps; resume with\n"
          f"  gyre train {args.config} --resume {run_dir}{extra}", file=sys.stderr)
    if args.json:
        print(json.dumps({"preempted": True, "steps_done": state["sched"]["steps_done"], "run_dir": str(run_dir)}))
    return PREEMPTED_EXIT


def launch(args: argparse.Namespace, cells: int, run_dir: Path, pending=None) -> int:
    """mpirun this job with 1 + cells ranks and wait for it; SIGTERM/SIGUSR1 preempt it (RUN_DIR/preempt.request,
    which rank 0 polls; ``pending``: a signal noted before mpirun started), a second one or SIGINT interrupts it."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise ConfigError("cluster.cells: a live run needs mpirun (apt-get install openmpi-bin) and mpi4py")
    root = str(Path(__file__).resolve().parents[1])
    from gyre_hpc import auth

    os.environ[auth.ENV] = auth.new_secret()  # this job's own secret (never one inherited from the shell)
    auth.write_secret(run_dir, os.environ[auth.ENV])  # to the ranks through the environment only
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM", "PMI_"))}
    env.update(dict(e.split("=", 1) for e in LOCAL_EXPORTS))  # Open MPI over loopback TCP, as root
    env.update(dict(e.split("=", 1) for e in SINGLE_HOST_EXPORTS))  # one host: shared memory, no rank listens
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p))
    env[LAUNCHED_ENV] = "1"
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-n", str(1 + cells)] + _rank_command(args, run_dir)
    from gyre_hpc.live.preempt import REQUEST_FILE

    (run_dir / REQUEST_FILE).unlink(missing_ok=True)  # a request of an earlier segment was served
    shutil.rmtree(run_dir / "errors", ignore_errors=True)  # an earlier segment's (its events.jsonl has them)
    with open(run_dir / "mpirun.log", "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=sys.stderr, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_dies_with_launcher())
        _forward_preemption(proc, run_dir)
        if pending is not None and pending.signal is not None:  # it came while mpirun was being started
            atomic_write_text(run_dir / REQUEST_FILE, pending.signal + "\n")
        try:
            return proc.wait()
        except BaseException:
            _stop_ranks(proc, run_dir)
            raise


def _dies_with_launcher():
    """mpirun gets SIGTERM when this launcher dies (even by SIGKILL): it ends its ranks, and they their services
    (gyre_hpc/engines/children.py); no process of the run outlives it."""
    from gyre_hpc.engines.children import dies_with_parent

    return dies_with_parent(signal.SIGTERM)


def _rank_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    """What every rank runs: this command, in role mode (inside the MPI world), with the same overrides."""
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(Path(args.config).resolve()), "--run-dir",
           str(run_dir.resolve())]
    return cmd + [a for o in args.overrides for a in ("--set", o)]


def _dry_run(cfg, args: argparse.Namespace) -> int:
    """The layout (the SLURM job's nodes inside an allocation, else local names) and the launch command."""
    from gyre_hpc.slurm import env as slurm_env
    from gyre_hpc.slurm.dryrun import describe
    from gyre_hpc.slurm.layout import local_nodes, plan, plan_from_env

    run_dir = Path(args.run_dir or f"{cfg.run.out_dir}/{cfg.run.name}-TIMESTAMP")
    if slurm_env.in_slurm():
        env = slurm_env.from_environ()
        layout = plan_from_env(cfg.cluster, env)
        launch_cmd = ["srun"] + layout.control_srun_args() + _rank_command(args, run_dir)
        source = f"SLURM job {env.job_id}"
    else:
        layout = plan(cfg.cluster, local_nodes(cfg.cluster))
        launch_cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(layout.world_size)]
        launch_cmd += _rank_command(args, run_dir)
        source = "no SLURM job: local node names, one machine"
    print(describe(layout, cfg.cluster, source, [launch_cmd]), end="")
    return 0


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _forward_preemption(proc: subprocess.Popen, run_dir: Path) -> None:
    """SIGTERM/SIGUSR1 to ``gyre train`` become RUN_DIR/preempt.request, which rank 0 polls: no rank is
    signalled, so none can die of it while it starts up, and a signal a rank does get is mpirun's teardown."""
    from gyre_hpc.live.preempt import REQUEST_FILE

    def preempt(signum, frame) -> None:
        print(f"gyre train: {signal.Signals(signum).name}: preempting (the step in progress ends, the resume state "
              f"is saved); send SIGTERM again to interrupt", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            atomic_write_text(run_dir / REQUEST_FILE, signal.Signals(signum).name + "\n")
        signal.signal(signal.SIGTERM, _interrupted)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    signal.signal(signal.SIGTERM, preempt)
    signal.signal(signal.SIGUSR1, preempt)


def _stop_ranks(proc: subprocess.Popen, run_dir: Path) -> None:
    """Interrupted: dump every rank's stacks to RUN_DIR/traces/ (SIGUSR2), then end mpirun's whole session."""
    import psutil

    try:
        ranks = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        ranks = []
    for p in ranks:
        with contextlib.suppress(psutil.Error):
            if "gyre_hpc.cli" in " ".join(p.cmdline()):
                p.send_signal(signal.SIGUSR2)
    time.sleep(1.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    print(f"gyre train: interrupted; stacks of the ranks in {run_dir / 'traces'}", file=sys.stderr)


def _rank(cfg, args: argparse.Namespace, preemption=None) -> int:
    """One rank of the live run: rank 0 drives, the others run their cell. ``preemption`` was installed before
    anything heavy (``_early_preemption``; installed here for a caller that has not: the submitit task)."""
    if preemption is None:
        preemption = _early_preemption(rank=True)
    if not args.run_dir:
        raise ConfigError("inside an MPI world, gyre train needs --run-dir (the launcher sets it)")
    from gyre_hpc.live.preempt import REQUEST_FILE

    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if os.environ.get(LAUNCHED_ENV):
        preemption.watch(run_dir / REQUEST_FILE)
    _check_placement(cfg)
    check_resume_config(cfg, run_dir)  # every rank alike, before MPI starts
    _check_resume_files(run_dir)
    from gyre_hpc.allocator.mpi_transport import MpiTransport
    from gyre_hpc.live.dataplane import open_data_comm
    from gyre_hpc.clock import WallClock

    transport = MpiTransport(1 + cfg.cluster.cells, clock=WallClock(_last_event_t(cfg, run_dir)))
    _traceback_on_signal(run_dir / "traces" / f"rank{transport.rank}.txt")
    comm = open_data_comm()
    from gyre_hpc.live.secret import share_job_secret

    with _abort_world_on_error(transport.rank, run_dir):
        share_job_secret(comm, run_dir)  # every listener of the job requires it (gyre_hpc/auth.py)
        try:
            return _role(cfg, args, run_dir, transport, comm, preemption)
        finally:
            preemption.ignore()  # a late signal must not kill this rank in MPI_Finalize (live/preempt.py)


def _check_resume_files(run_dir: Path) -> None:
    """A rank started on a RUN_DIR with a resume state (the requeued SLURM job): every file it needs is there,
    checked before MPI starts (a ``CheckpointError`` naming the first one missing, alike on every rank)."""
    from gyre_hpc import resume

    if resume.exists(run_dir):
        resume.check_files(run_dir, resume.load(run_dir))


def _last_event_t(cfg, run_dir: Path) -> float:
    """Where a resumed run's time line starts: after the last event of the earlier segments (0 for a new run)."""
    from gyre_hpc import resume
    from gyre_hpc.allocator.eventlog import read_events

    path = run_dir / cfg.allocator.events_file
    if not resume.exists(run_dir) or not path.is_file():
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
            with contextlib.suppress(OSError):
                (run_dir / "errors").mkdir(exist_ok=True)
                (run_dir / "errors" / f"rank{rank}.txt").write_text(f"{type(exc).__name__}: {exc}\n")
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def _role(cfg, args: argparse.Namespace, run_dir: Path, transport, comm, preemption) -> int:
    if transport.rank == 0:
        from gyre_hpc.live.root import run_root

        out = run_root(cfg, run_dir, transport, comm, preemption)
        if out.get("preempted") and not out.get("saved"):
            raise GyreError(f"preempted ({out['preempted']}), but the resume state could not be saved: "
                            f"{out.get('error')}; the last checkpoint is {run_dir / 'checkpoints' / 'latest'}")
        preempted = bool(out.get("preempted"))
        if not preempted:
            _print(out, args.json)  # the job's output ends with the summary
        if out.get("error"):  # stopped in order, but failed (data loss): the step fails
            return 1
    else:
        from gyre_hpc.live.cell_runner import CellRunner

        proxy_url = comm.bcast(None, root=0)
        runner = CellRunner(cfg, run_dir, transport, comm, proxy_url, preemption)
        runner.run()
        preempted = runner.preempted
    return PREEMPTED_EXIT if preempted else 0


def _check_plugin_agent(cfg) -> None:
    """A plugin agent's entries are imported now (errors name the key); its runs talk to the proxy's OpenAI
    endpoint, whose chat template is the model's tokenizer (model.hf_path or proxy.openai.tokenizer)."""
    if cfg.agent.kind == "synthetic":
        return
    from gyre_hpc.agents.plugins import load_plugins

    load_plugins(cfg.agent, cfg.grader)
    if cfg.model.hf_path is None and cfg.proxy.openai.tokenizer is None:
        raise ConfigError(f"agent.kind: {cfg.agent.kind!r} agents speak chat completions; set model.hf_path (a model "
                          f"made by `gyre model init`) or proxy.openai.tokenizer so the proxy has a chat template")


def _check_placement(cfg) -> None:
    """Inside a SLURM step: this rank runs where the layout puts it (world size, SLURMD_NODENAME), else a
    LayoutError naming the key, before MPI starts (every rank fails alike, so the step ends at once)."""
    from gyre_hpc.slurm import env as slurm_env
    from gyre_hpc.slurm.layout import plan_from_env

    env = slurm_env.from_environ() if slurm_env.in_slurm() else None
    if env is not None and env.step_id is not None:  # srun's ranks; mpirun's ranks have no SLURM variables
        plan_from_env(cfg.cluster, env).placement_from_env(env)


def _traceback_on_signal(path: Path) -> None:
    """``kill -USR2 PID`` makes a rank append every thread's stack to ``path``: how to see where a hung rank is.
    ``gyre train`` signals every rank when it is interrupted (Ctrl-C, a second SIGTERM, a test's timeout).
    (SIGUSR1 is the preemption signal: live/preempt.py.)"""
    import faulthandler
    import signal

    path.parent.mkdir(parents=True, exist_ok=True)
    faulthandler.register(signal.SIGUSR2, file=open(path, "a"), all_threads=True)  # noqa: SIM115 (kept open)


def _print(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary))
        return
    rf, rl = summary.get("reward_first"), summary.get("reward_last")
    print(f"{summary['policy']}: {summary['steps']} steps in {summary['wall_s']:.0f}s, "
          f"switches r->t {summary.get('switches_r2t')} t->r {summary.get('switches_t2r')}, "
          f"reward {rf if rf is None else round(rf, 3)} -> {rl if rl is None else round(rl, 3)}, "
          f"staleness mean {summary.get('staleness_mean', 0):.2f} max {summary.get('staleness_max')}; "
          f"run directory {summary['run_dir']}")


def _sync(cfg, args: argparse.Namespace) -> int:
    """The synchronous single-engine loop (the interim main job before the elastic runtime)."""
    from tqdm import tqdm

    from gyre_hpc.agents.closed_loop import run_closed_loop
    from gyre_hpc.report.train_plots import reward_curve
    from gyre_hpc.train import agreement

    run_dir = make_run_dir(cfg.run.out_dir, cfg.run.name)
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    bar = tqdm(total=cfg.allocator.steps, desc="train", unit="step", file=sys.stderr, disable=None)
    t0 = time.perf_counter()

    def on_step(rec) -> None:
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec.to_dict()) + "\n")
        bar.set_postfix(v=rec.version, reward=f"{rec.reward:.3f}", scored=f"{rec.scored_runs}/{rec.runs}")
        bar.update(1)

    res = run_closed_loop(cfg.agent, cfg.model, cfg.train, cfg.trajectory, cfg.engine,
                          steps=cfg.allocator.steps, groups_per_step=cfg.scheduler.batch_groups,
                          seed=cfg.run.seed, work_dir=run_dir, epochs=cfg.train.epochs, on_step=on_step)
    bar.close()
    rewards = [s.reward for s in res.steps]
    summary = {
        "policy": "sync_single_engine", "steps": len(res.steps), "wall_s": round(time.perf_counter() - t0, 2),
        "runs_finished": sum(s.runs for s in res.steps), "runs_scored": sum(s.scored_runs for s in res.steps),
        "trained_tokens": sum(s.trained_tokens for s in res.steps),
        "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
        **agreement.combine(s.to_dict() for s in res.steps),
        "run_dir": str(run_dir),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    reward_curve(rewards, run_dir / "reward.png")
    _print({**summary, "switches_r2t": 0, "switches_t2r": 0}, args.json)
    return 0
