"""Learnability of the synthetic agent task: a tiny random-init model improves its reward within minutes of CPU RL.

The closed loop (``gyre_hpc.agents.closed_loop``): a real local engine generates the runs of fresh queries, the
harness scores them and writes TITO, the trajectory pipeline packs the branching runs, the megatron Trainer
steps, and the engine loads the exported weights. Baseline measured in the same run: the same held-out queries,
with the same sampling seeds, before any training (version 0) and after the last step. Also printed: the
chance level of a uniform policy, and the mean reward of the first and last ``--window`` training steps.

    python benchmarks/bench_learning.py --seed 0 --json /tmp/learning.json

Records go to ``benchmarks/results/agents.md`` by hand (command, machine, date, numbers).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

from gyre_hpc.agents.task import CONTENT
from gyre_hpc.config import AgentConfig, EngineConfig, ModelConfig, TrainConfig, TrajectoryConfig

#: The learning workload: shorter runs than the defaults (every branch kind still occurs), tiny tool times.
AGENT = dict(runs_per_group=8, turns=(1, 3), call_tokens=4, answer_tokens=8, tool_output_tokens=(1, 4),
             context_budget=40, tool_failure_prob=0.15, subagent_prob=0.15, tool_time_median_s=0.02,
             tool_time_sigma=1.0, timeout_s=30.0)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--groups", type=int, default=8, help="queries per step")
    p.add_argument("--runs", type=int, default=8, help="runs per query (group size)")
    p.add_argument("--key-classes", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--loss", choices=("pg", "ppo"), default="ppo")
    p.add_argument("--epochs", type=int, default=4, help="optimizer steps per batch (ppo)")
    p.add_argument("--eval-groups", type=int, default=16)
    p.add_argument("--window", type=int, default=5, help="steps averaged at the start and at the end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the trainer and of the engine")
    p.add_argument("--json", default=None, help="write the step records and evaluations here")
    return p.parse_args()


def configs(a: argparse.Namespace):
    agent = AgentConfig(**{**AGENT, "runs_per_group": a.runs, "key_classes": a.key_classes})
    engine = EngineConfig(max_running_requests=a.groups * a.runs, context_len=256, torch_threads=a.threads)
    train = TrainConfig(lr=a.lr, loss=a.loss, threads=a.threads)
    return agent, ModelConfig(), train, TrajectoryConfig(max_row_tokens=512), engine


def answer_stats(work: str, name: str, agent: AgentConfig, seed: int, vocab_size: int) -> dict:
    """Of the final answers of the finished runs in ``tito/<name>``: the fraction of content tokens, and among
    those the fraction in the key's class (reward = content fraction x key accuracy, up to early stops)."""
    from pathlib import Path

    from gyre_hpc.agents.harness import read_runs
    from gyre_hpc.agents.task import is_right
    from gyre_hpc.agents.workload import Workload

    log = read_runs(sorted(Path(work, "tito", name).glob("*.jsonl")), vocab_size)
    w = Workload(agent, vocab_size, seed)
    content = right = total = 0
    for run_id, calls in log.runs.items():
        if log.outcome[run_id].status.value != "scored" or not calls:
            continue
        out = calls[-1].output_ids[: agent.answer_tokens]
        key = w.task(int(run_id[1:].split("-")[0])).key
        content += int((out >= CONTENT).sum())
        right += int(is_right(out, key, agent.key_classes).sum())
        total += len(out)
    return {"content_frac": content / max(total, 1), "key_acc": right / max(content, 1)}


def mean(scores) -> float:
    got = [s for s in scores if s is not None]
    return float(np.mean(got)) if got else float("nan")


def main() -> int:
    from gyre_hpc.agents.closed_loop import run_closed_loop

    a = parse_args()
    agent, model, train, trajectory, engine = configs(a)
    t0 = time.perf_counter()

    def show(r) -> None:
        print(f"step {r.step:3d}  v{r.version:<4d} reward {r.reward:.3f}  scored {r.scored_runs:3d}/{r.runs:<3d} "
              f"trained tok {r.trained_tokens:5d}  rollout {r.rollout_s:5.1f}s  train {r.train_s:4.1f}s  "
              f"t={time.perf_counter() - t0:5.0f}s", flush=True)

    with tempfile.TemporaryDirectory(prefix="gyre-learning-") as work:
        res = run_closed_loop(agent, model, train, trajectory, engine, steps=a.steps, groups_per_step=a.groups,
                              seed=a.seed, work_dir=work, epochs=a.epochs, eval_groups=a.eval_groups, on_step=show)
        answers = {name: answer_stats(work, name, agent, a.seed, model.vocab_size)
                   for name in ("eval-before", "eval-after")} if a.eval_groups else {}
    wall = time.perf_counter() - t0
    rewards = [r.reward for r in res.steps]
    chance = (1 - CONTENT / model.vocab_size) / agent.key_classes
    paired = [(b, c) for b, c in zip(res.eval_before, res.eval_after) if b is not None and c is not None]
    diff = np.array([c - b for b, c in paired])
    summary = {
        "wall_s": wall, "steps": a.steps, "runs_per_step": a.groups * a.runs, "chance": chance,
        "first_window": float(np.mean(rewards[: a.window])), "last_window": float(np.mean(rewards[-a.window:])),
        "eval_before": mean(res.eval_before), "eval_after": mean(res.eval_after), "eval_runs": len(paired),
        "eval_gain_se": float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan"),
        "eval_answers": answers,
        "branches": {k: sum(r.branches.get(k, 0) for r in res.steps)
                     for k in ("root", "continuation", "retry", "compression", "subagent")},
    }
    print(json.dumps(summary, indent=1))
    print(f"reward curve (mean per step): {' '.join(f'{x:.3f}' for x in rewards)}")
    print(f"held-out eval: {summary['eval_before']:.3f} -> {summary['eval_after']:.3f} "
          f"(ratio {summary['eval_after'] / summary['eval_before']:.2f}, paired gain SE {summary['eval_gain_se']:.3f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "summary": summary, **res.to_dict()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
