"""``gyre trajectory``: inspect, pack and synthesize TITO logs.

Reads a TITO log (docs/tito.md), builds each run's prefix tree, applies J_max and scoring, and either prints
counts (``stats``) or writes training samples (``pack``, format in docs/trajectories.md). ``synth`` writes a
synthetic branching log for tests and benchmarks.

Every failure is one line on stderr (what, where, what to do) and exit status 2, with nothing written: a bad
log (the first problems with ``file:line``, and how many more), an empty log, a pack with no run that trains,
an output that cannot be written. Outputs go to temporary siblings and are renamed into place.
"""
from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Iterator

from gyre_hpc.config import load_config
from gyre_hpc.errors import TrajectoryError
from gyre_hpc.trajectory.pipeline import STATS_KEYS, build_batch, plan, save_packed
from gyre_hpc.trajectory.records import TitoFormatError, TitoLog, read_tito, write_tito
from gyre_hpc.trajectory.synth import DEFAULTS, KNOB_DOCS, synth_log
from jobs import add_overrides

DESCRIPTION = """\
gyre trajectory stats FILE [--j-max N|null] [--json]   runs, calls, paths, tokens (flat vs tree), exclusions
gyre trajectory pack FILE --out DIR [--mode tree|flat] write DIR/batch.npz and DIR/report.json
gyre trajectory synth --out FILE [--queries N ...]     write a synthetic branching TITO log

Counts of paths and tokens cover the runs that train (scored or timeout_partial, in a group with signal).
Examples:
  gyre trajectory synth --out /tmp/log.jsonl --queries 16 --runs 8 --seed 1
  gyre trajectory stats /tmp/log.jsonl --j-max null --json
  gyre trajectory pack /tmp/log.jsonl --out /tmp/batch --mode tree --set trajectory.max_row_tokens=2048
"""


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (its trajectory section is used; defaults when omitted)")
    add_overrides(p, "trajectory.selection=final_then_longest")
    p.add_argument("--j-max", dest="j_max", metavar="N", help="paths per run (an integer, or null = unlimited)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    stats = sub.add_parser("stats", help="count runs, calls, paths and tokens of a TITO log")
    stats.add_argument("file", help="TITO JSONL log")
    stats.add_argument("--json", action="store_true", help=f"print one JSON object with keys {', '.join(STATS_KEYS)}")
    _config_args(stats)
    pack = sub.add_parser("pack", help="write packed training samples (batch.npz + report.json)")
    pack.add_argument("file", help="TITO JSONL log")
    pack.add_argument("--out", required=True, help="output directory")
    pack.add_argument("--mode", choices=["tree", "flat"], help="packing mode (default: trajectory.pack_mode)")
    _config_args(pack)
    synth = sub.add_parser("synth", help="write a synthetic branching TITO log")
    synth.add_argument("--out", required=True, help="output JSONL file")
    synth.add_argument("--queries", type=int, default=8, help="queries (groups)")
    synth.add_argument("--runs", type=int, default=4, help="runs per query")
    synth.add_argument("--seed", type=int, default=0, help="seed (the log is a function of it)")
    for name, default in DEFAULTS.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, tuple):
            synth.add_argument(flag, type=int, nargs=2, metavar=("MIN", "MAX"), default=default,
                               help=f"{KNOB_DOCS[name]} (default {default[0]} {default[1]})")
        else:
            synth.add_argument(flag, type=type(default), default=default, metavar=type(default).__name__.upper(),
                               help=f"{KNOB_DOCS[name]} (default {default})")


def _trajectory_config(args: argparse.Namespace):
    overrides = list(args.overrides)
    if args.j_max is not None:
        overrides.append(f"trajectory.j_max={args.j_max}")
    return load_config(args.config, overrides).trajectory


def _read(path: str, vocab_size: int | None, action: str) -> TitoLog:
    """The log at ``path``, or a one-line ``TrajectoryError`` (bad lines, no records at all)."""
    try:
        log = read_tito(path, vocab_size=vocab_size)
    except TitoFormatError as exc:
        raise TrajectoryError(exc.one_line()) from None
    if not log.calls and not log.outcomes:
        raise TrajectoryError(f"{path}: no TITO records (the file is empty); nothing to {action}: give a log the "
                              "proxy wrote (RUN_DIR/tito/*.jsonl) or one from `gyre trajectory synth`")
    return log


@contextlib.contextmanager
def _writing(out: str) -> Iterator[None]:
    """An ``OSError`` while writing ``out`` becomes a one-line ``TrajectoryError``."""
    try:
        yield
    except OSError as exc:
        raise TrajectoryError(f"{out}: cannot write ({exc.strerror or exc}); nothing was written: "
                              "choose a writable --out") from None


def run(args: argparse.Namespace) -> int:
    if args.action == "synth":
        knobs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items() if k in DEFAULTS}
        log = synth_log(args.queries, args.runs, seed=args.seed, **knobs)
        with _writing(args.out):
            write_tito(args.out, log.calls, log.outcomes)
        print(f"wrote {args.out}: {len(log.outcomes)} runs, {len(log.calls)} calls")
        return 0
    cfg = _trajectory_config(args)
    log = _read(args.file, cfg.vocab_size, "count" if args.action == "stats" else "pack")
    if args.action == "stats":
        report = plan(log, cfg).report
        if args.json:
            print(json.dumps(report.stats()))
            return 0
        for key, value in report.stats().items():
            print(f"{key:<20} {value}")
        ratio = report.tree_tokens / report.flat_tokens if report.flat_tokens else float("nan")
        print(f"{'tree/flat':<20} {ratio:.3f}")
        extra = {"timeout_unscorable": report.timeout_unscorable, "aborted": report.aborted,
                 "runs_trained": report.runs_trained, "groups": report.groups,
                 "groups_dropped": report.groups_dropped}
        for key, value in {**extra, **{f"branches.{k}": v for k, v in sorted(report.branches.items())}}.items():
            print(f"{key:<20} {value}")
        return 0
    batch, report = build_batch(log, cfg, args.mode)
    if batch.tokens == 0:
        raise TrajectoryError(
            f"{args.file}: no run trains ({report.runs} runs: {report.eval_failures} eval_failure, "
            f"{report.timeout_unscorable} timeout_unscorable, {report.aborted} aborted, {report.groups_dropped} "
            f"group(s) with equal scores); nothing written to {args.out}: `gyre trajectory stats` shows why")
    with _writing(args.out):
        save_packed(Path(args.out), batch, report)
    print(f"wrote {args.out}: {batch.shape[0]} rows x {batch.shape[1]}, {batch.tokens} tokens, "
          f"{batch.trained_tokens} trained")
    return 0
