"""``gyre train``: reinforcement learning of the policy on the synthetic agent workload.

Interim main job (until the elastic MPI runtime lands): the synchronous loop of ``gyre_hpc.agents.closed_loop``
on one local engine — generate groups of branching agent runs, score them, pack them as prefix trees, train the
megatron policy, hand the new weights to the engine — for ``allocator.steps`` optimizer steps of
``scheduler.batch_groups`` queries each. The run directory gets the resolved config, TITO logs, per-step
metrics (JSONL), the final weights and a reward-curve PNG.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import yaml

from gyre_hpc.config import load_config, to_dict
from gyre_hpc.io import atomic_write_json, atomic_write_text, make_run_dir

DESCRIPTION = """\
Run RL training on the embedded default (tiny CPU model, local engine, synthetic agent workload).

  gyre train configs/local.yaml
  gyre train configs/local.yaml --set allocator.steps=4 --json

The run directory (run.out_dir/run.name-TIMESTAMP) holds config.yaml, tito/, metrics.jsonl, summary.json,
weights/ and reward.png. --json prints the summary as one JSON object at the end.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config, e.g. configs/local.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable), e.g. --set allocator.steps=4")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)  # fails here, before any process starts
    from tqdm import tqdm

    from gyre_hpc.agents.closed_loop import run_closed_loop
    from gyre_hpc.report.train_plots import reward_curve

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
                          seed=cfg.run.seed, work_dir=run_dir, epochs=cfg.train.mu, on_step=on_step)
    bar.close()
    rewards = [s.reward for s in res.steps]
    summary = {
        "policy": "sync_single_engine", "steps": len(res.steps), "wall_s": round(time.perf_counter() - t0, 2),
        "runs_finished": sum(s.runs for s in res.steps), "runs_scored": sum(s.scored_runs for s in res.steps),
        "trained_tokens": sum(s.trained_tokens for s in res.steps),
        "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
        "run_dir": str(run_dir),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    reward_curve(rewards, run_dir / "reward.png")
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['steps']} steps in {summary['wall_s']:.0f}s, reward {summary['reward_first']:.3f} -> "
              f"{summary['reward_last']:.3f}; run directory {run_dir}")
    return 0
