"""The ``gyre`` command: one subcommand per module in ``jobs/``.

Each job module defines ``DESCRIPTION`` (the ``--help`` text), ``add_arguments(parser)``
and ``run(args) -> int``. Job modules are imported only when their subcommand runs, so ``gyre --help`` stays
fast and never imports torch. A ``GyreError`` becomes one line on stderr and exit status 2.
Third-party log noise is silenced unless ``--verbose`` (``gyre_hpc/launcher/quiet.py``).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from gyre_hpc.launcher import quiet
from gyre_hpc.errors import GyreError

#: subcommand → job module. Order is the order ``gyre --help`` lists them.
COMMANDS = {
    "train": "jobs.train",
    "simulate": "jobs.simulate",
    "submit": "jobs.submit",
    "sweep": "jobs.sweep",
    "tune": "jobs.tune",
    "trajectory": "jobs.trajectory",
    "config": "jobs.config",
    "tasks": "jobs.tasks",
    "model": "jobs.model",
    "serve": "jobs.serve",
}

_HELP = {
    "train": "run the main job: elastic RL training on the configured cells",
    "simulate": "predict wall time, idle fractions and staleness of scheduling policies",
    "submit": "render the sbatch script from the config and submit it (--dry-run prints it)",
    "sweep": "run a grid of training or simulator runs as one SLURM job array; CSV, table and plot",
    "tune": "choose theta, tau, mu and the cell split in the simulator; write them as a config overlay",
    "trajectory": "inspect, synthesize and pack TITO logs (stats, pack, synth)",
    "config": "explain every config key, or print a resolved config",
    "tasks": "verify repository-repair tasks: unmodified scores 0.0, the reference patch 1.0",
    "model": "Hugging Face model directories: init a tiny one, export trained weights, check the bridge",
    "serve": "serve the rollout side alone: engines + the proxy's OpenAI endpoint, TITO to a directory",
}


#: commands whose processes print third-party logs: they take ``--verbose`` (gyre_hpc/launcher/quiet.py)
VERBOSE_COMMANDS = ("train", "submit", "sweep")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gyre",
        description="gyre_hpc: SLURM-native elastic RL for long-horizon coding agents. "
        "Run `gyre COMMAND --help` for the options of each command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if a in COMMANDS), None)
    for name, module_name in COMMANDS.items():
        if name != wanted:  # only the invoked job module is imported
            sub.add_parser(name, help=_HELP[name])
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(
            name,
            help=_HELP[name],
            description=module.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        if name in VERBOSE_COMMANDS:
            p.add_argument("--verbose", action="store_true", help="show third-party log noise (silenced by "
                           "default; the setting reaches every child process through GYRE_VERBOSE=1)")
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"] and not {"--help", "-h", "--dry-run", "--sync"} & set(argv):
        from gyre_hpc.lifecycle import early_signals

        early_signals.arm()  # a preemption during the imports below is noted, not fatal (jobs/train.py)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    quiet.configure(getattr(args, "verbose", False))
    try:
        return int(args._run(args) or 0)
    except GyreError as exc:
        print(f"gyre {args.command}: error: {exc}", file=sys.stderr)
        _note_rank_error(args, exc)
        return 2


def _note_rank_error(args: argparse.Namespace, exc: GyreError) -> None:
    """A rank of a batch script's step that fails at start (a config or layout error: exit 2) leaves
    RUN_DIR/errors/rankN.txt, as a rank that raises later does: the script's relaunch helper then reads the step
    as an error, never as a rank lost while starting (gyre_hpc/slurm/relaunch.py: srun's status is the SIGTERM of
    the ranks it ended after this one failed)."""
    import os
    from pathlib import Path

    from gyre_hpc.lifecycle.recovery import SBATCH_ENV

    run_dir, rank = getattr(args, "run_dir", None), os.environ.get("SLURM_PROCID")
    if not run_dir or rank is None or not os.environ.get(SBATCH_ENV) or not Path(run_dir).is_dir():
        return
    from gyre_hpc.live.rank import record_error

    record_error(Path(run_dir), rank, exc)


if __name__ == "__main__":
    sys.exit(main())
