"""``gyre train``: reinforcement learning of the policy on the synthetic agent workload, with elastic cells.

::

    gyre train CONFIG            (not inside an MPI world or SLURM step)
      └─ mpirun --oversubscribe -n 1+K  python -m gyre_hpc.cli train CONFIG --run-dir RUN_DIR ...
           (the launcher: gyre_hpc.live.launch; every rank runs gyre_hpc.live.rank.run_rank)
           rank 0      allocator server + proxy + harness + data-plane hub   (gyre_hpc.live.root)
           rank c + 1  the cell runner of cell c: engine ⇄ trainer              (gyre_hpc.live.cell_runner)
      └─ prints the summary (summary.json of the run directory) as one JSON object with --json

Preemption: SIGTERM or SIGUSR1 to ``gyre train`` (or to the ranks: srun, scancel) saves the resume state and
every rank exits with status 75 (``gyre_hpc.lifecycle.recovery.PREEMPTED_EXIT``); ``gyre train CONFIG --resume RUN_DIR``
continues the run at the same step, and so does any rank started on a RUN_DIR that holds a resume state (the
requeued SLURM job). A second SIGTERM, or Ctrl-C, interrupts instead (stacks in RUN_DIR/traces/).
A cell's rank that dies (exit 69 with rank 0's resume state) does not end the command: it launches the run again
from that state, up to ``run.max_relaunches`` times (``gyre_hpc.live.supervise``; the summary counts
``relaunches``).

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
import sys
from pathlib import Path

from gyre_hpc.clock import WallClock
from gyre_hpc.config import GyreConfig, load_config
from gyre_hpc.errors import ConfigError, GyreError
from gyre_hpc.files.io import atomic_write_json
from gyre_hpc.models import run_init
from gyre_hpc.live.launch import launch, rank_command
from gyre_hpc.live.rank import check_resume_config, early_preemption, print_summary, run_rank
from gyre_hpc.lifecycle.recovery import ERROR_EXIT, PREEMPTED_EXIT, RANK_LOST_EXIT, saved_newer
from gyre_hpc.live.supervise import add_relaunches, supervise
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

A cell's rank that dies (exit 69, resume state saved) is relaunched from RUN_DIR/resume by this command, at most
run.max_relaunches times (default 2; --set run.max_relaunches=0 exits 69 instead).
"""

MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config, e.g. configs/local.yaml")
    add_overrides(p, "allocator.steps=4")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")
    p.add_argument("--sync", action="store_true", help="the synchronous single-engine loop (no cells, no MPI)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a preempted run from RUN_DIR/resume (steps, version and staleness carry on)")
    p.add_argument("--run-dir", help=argparse.SUPPRESS)  # set by the launcher for the ranks
    p.add_argument("--dry-run", action="store_true",
                   help="print the layout (every rank: node, GPU, cell, TP/PP/DP ranks) and the launch commands; "
                        "start nothing, touch no device; with --json as one JSON object")


def run(args: argparse.Namespace) -> int:
    live = not getattr(args, "dry_run", False) and not args.sync
    rank = live and any(k in os.environ for k in MPI_ENV)
    preemption = early_preemption(rank) if live else None  # before the config, heavy imports and MPI_Init
    cfg = load_config(args.config, args.overrides)  # fails here, before any process starts
    _check_plugin_agent(cfg)
    if run_init.wanted(cfg.model):
        run_init.check_qwen3(cfg.model)
    if getattr(args, "dry_run", False):
        return _dry_run(cfg, args)
    if args.sync:
        return _sync(cfg, args)
    if rank:
        _check_placement(cfg)
        return run_rank(cfg, args, preemption)
    from gyre_hpc.slurm.layout import preflight

    layout = preflight(cfg)  # one line naming the key, before anything is written or started
    if getattr(args, "resume", None):
        cfg = run_init.for_run(cfg, Path(args.resume))  # the run's own initial model, never a new one
        run_dir = _resumable(cfg, Path(args.resume))
        if run_dir is None:
            return 0
    else:
        run_dir, cfg = run_init.new_run(cfg, "gyre train")
    if preemption.signal is not None:  # preempted before any rank started: the empty resume state
        from gyre_hpc.lifecycle import resume

        if not resume.exists(run_dir):
            resume.save_empty(run_dir)
        return _preempted(args, run_dir)
    events_path = run_dir / cfg.allocator.events_file

    def launch_once() -> int:
        code = launch(args, layout.world_size, run_dir, preemption, listen_interface=cfg.cluster.listen_interface)
        _stop_left_behind(run_dir)
        return code

    # a lost cell's rank: relaunched from rank 0's resume state, up to run.max_relaunches times (live/supervise.py)
    code = supervise(run_dir, events_path, cfg.run.max_relaunches, launch_once,
                     lambda failed, before: _failed(cfg, run_dir, failed, before),
                     lambda: _resumable(cfg, run_dir), lambda: preemption.signal is not None)
    if code == PREEMPTED_EXIT:
        return _preempted(args, run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        return code  # reported by _failed
    summary = add_relaunches(summary_path, events_path)
    print_summary(summary, args.json)
    if summary.get("groups_lost"):
        print(f"gyre train: warning: {summary['groups_lost']} group(s) lost, their runs trained nothing (TITO "
              f"records missing, cut or inconsistent); see lost_groups in {summary_path}", file=sys.stderr)
    if summary.get("error"):
        raise GyreError(f"{summary['error']}; see {summary_path} and events.jsonl")
    return 0 if code == 0 else code


def _stop_left_behind(run_dir: Path) -> None:
    """SIGKILL engine processes that outlived their rank (engines.leftovers: an SGLang detokenizer whose server was
    killed while starting, when another rank failed); says so on stderr."""
    from gyre_hpc.engines.leftovers import kill_left_behind

    if killed := kill_left_behind(run_dir):
        print(f"gyre train: stopped {len(killed)} engine process(es) left behind by the ranks (PIDs "
              f"{', '.join(map(str, killed))})", file=sys.stderr)


def _failed(cfg: GyreConfig, run_dir: Path, code: int, before: int = 0) -> int:
    """mpirun ended without a summary and not preempted: an ``error`` event if a rank reported one (rank 0 writes
    it, and every rank that raises leaves RUN_DIR/errors/rankN.txt), else ``rank_lost``; one line, and the exit
    status of that kind. ``before``: how many events earlier segments wrote (a resume state this segment's rank 0
    saved, event ``lost_rank_saved``, is named in the event and the message)."""
    from gyre_hpc.allocator.eventlog import EventLog, read_events

    path = run_dir / cfg.allocator.events_file
    try:
        events = read_events(path) if path.is_file() else []
    except GyreError:
        events = []
    errors = sorted((run_dir / "errors").glob("rank*.txt")) if (run_dir / "errors").is_dir() else []
    detail: list[str] = []
    if events and events[-1]["event"] == "error":
        kind, why = "error", events[-1].get("error", "")
    elif errors:
        kind, why = "error", f"{errors[0].stem}: {errors[0].read_text().strip().splitlines()[0][:300]}"
        detail = errors[0].read_text().strip().splitlines()[1:]  # e.g. the tail of an engine's log
    else:
        kind, why = "rank_lost", f"a rank ended without finishing its role (mpirun exit {code})"
    saved = next((e["resume"] for e in events[before:] if e["event"] == "lost_rank_saved"), None)
    if saved is None and saved_newer(events[before:]) and (run_dir / "resume" / "state.json").is_file():
        saved = str(run_dir / "resume")  # rank 0's periodic state (live/periodic.py): rank 0 itself may have died
    if not events or events[-1]["event"] != "error":
        t = max((e.get("t", 0.0) for e in events), default=0.0)
        with contextlib.suppress(OSError), contextlib.closing(EventLog(path, WallClock())) as log:
            log.write(kind, t=t, error=why, mpirun_exit=code, resume=saved)
    print(f"gyre train: {kind}: {why}; the live run ended (mpirun exit {code}) without a summary; see {run_dir} "
          f"(events.jsonl, cells/, proxy.log, mpirun.log)", file=sys.stderr)
    if saved is not None:
        print(f"gyre train: rank 0 saved the resume state {saved}; continue with\n"
              f"  gyre train CONFIG --resume {run_dir}", file=sys.stderr)
    if detail:
        print("\n".join("  " + line for line in detail[-20:]), file=sys.stderr)
    return RANK_LOST_EXIT if kind == "rank_lost" else ERROR_EXIT


def _resumable(cfg: GyreConfig, run_dir: Path) -> Path | None:
    """``--resume RUN_DIR``: the run directory, once its resume state and every file it needs have been checked
    (nothing in RUN_DIR is written before that); None when the run had finished (its summary is printed)."""
    from gyre_hpc.lifecycle import resume

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


def _preempted(args: argparse.Namespace, run_dir: Path) -> int:
    from gyre_hpc.lifecycle import resume

    state = resume.load(run_dir)  # fails (CheckpointError) if the ranks could not save it
    extra = "".join(f" --set {o}" for o in args.overrides)
    print(f"gyre train: preempted after {state['sched']['steps_done']} steps; resume with\n"
          f"  gyre train {args.config} --resume {run_dir}{extra}", file=sys.stderr)
    if args.json:
        print(json.dumps({"preempted": True, "steps_done": state["sched"]["steps_done"], "run_dir": str(run_dir)}))
    return PREEMPTED_EXIT


def _dry_run(cfg: GyreConfig, args: argparse.Namespace) -> int:
    """The layout (the SLURM job's nodes inside an allocation, else local names), the pre-flight verdict and the
    launch command; with --json one object whose ``ranks`` list holds every process."""
    from gyre_hpc.slurm import env as slurm_env
    from gyre_hpc.slurm.dryrun import as_json, describe
    from gyre_hpc.slurm.layout import geometry_problems, local_nodes, plan, plan_from_env

    run_dir = Path(args.run_dir or f"{cfg.run.out_dir}/{cfg.run.name}-TIMESTAMP")
    if slurm_env.in_slurm():
        env = slurm_env.from_environ()
        layout = plan_from_env(cfg.cluster, env)
        launch_cmd = ["srun"] + layout.control_srun_args() + rank_command(args, run_dir)
        source = f"SLURM job {env.job_id}"
    else:
        layout = plan(cfg.cluster, local_nodes(cfg.cluster))
        launch_cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(layout.world_size)]
        launch_cmd += rank_command(args, run_dir)
        source = "no SLURM job: local node names, one machine"
    problems = geometry_problems(cfg.cluster, cfg.model, cfg.engine, cfg.train)
    if args.json:
        print(json.dumps(as_json(layout, cfg.cluster, cfg.engine.tp, source, [launch_cmd], problems)))
    else:
        print(describe(layout, cfg.cluster, source, [launch_cmd], problems), end="")
    return 0


def _check_plugin_agent(cfg: GyreConfig) -> None:
    """A plugin agent's entries are imported now (errors name the key); its runs talk to the proxy's OpenAI
    endpoint, whose chat template is the model's tokenizer (model.hf_path, the run's RUN_DIR/model/init, or
    proxy.openai.tokenizer)."""
    if cfg.agent.kind == "synthetic":
        return
    from gyre_hpc.agents.plugins import load_plugins

    load_plugins(cfg.agent, cfg.grader)
    if cfg.model.hf_path is None and not run_init.wanted(cfg.model) and cfg.proxy.openai.tokenizer is None:
        raise ConfigError(f"agent.kind: {cfg.agent.kind!r} agents speak chat completions; set model.hf_path (a model "
                          f"made by `gyre model init`), model.qk_layernorm: true (the run writes a Qwen3 model with a "
                          f"tokenizer) or proxy.openai.tokenizer so the proxy has a chat template")


def _check_placement(cfg: GyreConfig) -> None:
    """Inside a SLURM step: this rank runs where the layout puts it (world size, SLURMD_NODENAME), else a
    LayoutError naming the key, before MPI starts (every rank fails alike, so the step ends at once)."""
    from gyre_hpc.slurm import env as slurm_env
    from gyre_hpc.slurm.layout import preflight

    env = slurm_env.from_environ() if slurm_env.in_slurm() else None
    if env is not None and env.step_id is not None:  # srun's ranks; mpirun's ranks have no SLURM variables
        preflight(cfg, env.job_nodes, env.gpus_on_node).placement_from_env(env)


def _sync(cfg: GyreConfig, args: argparse.Namespace) -> int:
    """The synchronous single-engine loop (the interim main job before the elastic runtime)."""
    from tqdm import tqdm

    from gyre_hpc.agents.closed_loop import run_closed_loop
    from gyre_hpc.report.train_plots import reward_curve
    from gyre_hpc.train import agreement

    run_dir, cfg = run_init.new_run(cfg, "gyre train")
    bar = tqdm(total=cfg.allocator.steps, desc="train", unit="step", file=sys.stderr, disable=None)
    clock = WallClock()

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
        "policy": "sync_single_engine", "steps": len(res.steps), "wall_s": round(clock.now(), 2),
        "runs_finished": sum(s.runs for s in res.steps), "runs_scored": sum(s.scored_runs for s in res.steps),
        "trained_tokens": sum(s.trained_tokens for s in res.steps),
        "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
        **agreement.combine(s.to_dict() for s in res.steps),
        "run_dir": str(run_dir),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    reward_curve(rewards, run_dir / "reward.png")
    print_summary({**summary, "switches_r2t": 0, "switches_t2r": 0}, args.json)
    return 0
