"""Does the default live run learn? ``gyre train CONFIG`` per seed, then its reward curve from ``metrics.jsonl``.

For each seed: the run's wall time, the mean reward of the first and of the last ``--window`` steps, their
difference, and the per-step rewards and staleness split. ``--baseline-set KEY=VALUE ...`` also runs each seed
with those overrides (e.g. the previous defaults), so the comparison is measured in the same session.
``--runs DIR ...`` summarizes finished run directories instead of launching runs.

    python benchmarks/bench_live_learning.py --seeds 0 1 2
    python benchmarks/bench_live_learning.py --seeds 0 --baseline-set train.epochs=1 train.lr=0.01 scheduler.mu=1
    python benchmarks/bench_live_learning.py --runs runs/local-2026...

Records go to ``benchmarks/results/live_learning.md`` by hand (command, machine, load, date, numbers).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from statistics import mean, median

from gyre_hpc.files.jsonl import read_objects


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/local.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", dest="overrides", nargs="*", default=[], help="KEY=VALUE overrides for every run")
    p.add_argument("--baseline-set", nargs="*", default=None, help="also run each seed with these overrides")
    p.add_argument("--runs", nargs="*", default=None, help="summarize these run directories; launch nothing")
    p.add_argument("--window", type=int, default=3, help="steps averaged at the start and at the end")
    p.add_argument("--out-dir", default="runs/bench-live-learning")
    return p.parse_args()


def launch(config: str, seed: int, overrides: list[str], out_dir: str) -> Path:
    sets = [f"run.seed={seed}", f"run.out_dir={out_dir}", *overrides]
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", config, "--json"]
    for s in sets:
        cmd += ["--set", s]
    print("+", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    return Path(json.loads(done.stdout.strip().splitlines()[-1])["run_dir"])


def summarize(run_dir: Path, window: int) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [rec for _, rec in read_objects(run_dir / "metrics.jsonl", torn_tail=True, what="metrics")]
    rewards = [s["reward"] for s in steps if s.get("reward") is not None]
    first, last = mean(rewards[:window]), mean(rewards[-window:])
    return {"run_dir": str(run_dir), "seed": _seed(run_dir), "steps": len(steps), "wall_s": summary["wall_s"],
            "first": round(first, 3), "last": round(last, 3), "gain": round(last - first, 3),
            "rewards": [round(r, 3) for r in rewards], "epochs": steps[-1].get("epochs", 1),
            "staleness": [summary["staleness_mean"], summary.get("staleness_prequeue_mean"),
                          summary.get("staleness_inqueue_mean")],
            "switches": summary["switches_r2t"] + summary["switches_t2r"]}


def _seed(run_dir: Path) -> int | None:
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    return cfg.get("run", {}).get("seed")


def report(label: str, rows: list[dict]) -> None:
    for r in rows:
        print(json.dumps({"label": label, **r}))
    if rows:
        print(f"{label}: {len(rows)} runs, median first {median(r['first'] for r in rows):.3f} -> last "
              f"{median(r['last'] for r in rows):.3f} (median gain {median(r['gain'] for r in rows):+.3f}), "
              f"median wall {median(r['wall_s'] for r in rows):.0f} s", flush=True)


def main() -> int:
    a = parse_args()
    if a.runs is not None:
        report("runs", [summarize(Path(d), a.window) for d in a.runs])
        return 0
    rows, base = [], []
    for seed in a.seeds:
        rows.append(summarize(launch(a.config, seed, a.overrides, a.out_dir), a.window))
        if a.baseline_set is not None:
            base.append(summarize(launch(a.config, seed, [*a.overrides, *a.baseline_set], a.out_dir), a.window))
    report("config", rows)
    report("baseline", base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
