"""What rank 0's periodic resume state costs (gyre_hpc/live/periodic.py): ms per save, and its share of a step.

    python benchmarks/bench_periodic_resume.py --json [--config configs/local.yaml] [--steps 6] [--reps 2]
    python benchmarks/bench_periodic_resume.py --json --run-dirs RUN_DIR...      (runs already made)

Each repetition is one live run (``gyre train CONFIG --json --set allocator.steps=N --set run.resume_every_steps=1``)
on the short 1 + 2 rank set-up of tests/integration/test_preempt_edges.py (or the run directories given). Rank 0
times each save itself (event ``resume_saved``, ``save_ms``: the snapshot under the harness's lock, the hard links of
the checkpoint, state.json, the rename), on its allocator thread, which does nothing else meanwhile. The baseline,
from the same run: the step interval (``t`` between consecutive ``train_step`` events). It prints medians over every
save and step of every run, the share ``save_ms / step_ms``, and the largest state.json written (``state_bytes``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gyre_hpc.allocator.eventlog import read_events  # noqa: E402

#: the short 1 + 2 rank run of tests/integration/test_preempt_edges.py (benchmarks/chaos_live.py uses it too)
OVERRIDES = ["cluster.cells=2", "scheduler.policy=async", "scheduler.async_train_cells=1", "scheduler.batch_groups=2",
             "agent.runs_per_group=2", "agent.turns=[1, 2]", "allocator.hello_timeout_s=600",
             "allocator.heartbeat_timeout_s=300", "proxy.startup_timeout_s=180", "engine.startup_timeout_s=600",
             "agent.timeout_s=120", "agent.tool_time_median_s=1.0"]


def run_once(config: str, steps: int, out: Path) -> Path:
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", config, "--json", "--set", f"run.out_dir={out}",
           "--set", f"allocator.steps={steps}", "--set", "run.resume_every_steps=1"]
    cmd += [a for o in OVERRIDES for a in ("--set", o)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gyre train exited {done.returncode}:\n{done.stderr[-3000:]}")
    return Path(json.loads(done.stdout.strip().splitlines()[-1])["run_dir"])


def measure(run_dir: Path) -> dict:
    events = read_events(run_dir / "events.jsonl")
    saves = [e["save_ms"] for e in events if e["event"] == "resume_saved"]
    size = max((e.get("state_bytes", 0) for e in events if e["event"] == "resume_saved"), default=0)
    t = [e["t"] for e in events if e["event"] == "train_step"]
    return {"run_dir": str(run_dir), "save_ms": saves, "step_ms": [1e3 * (b - a) for a, b in zip(t, t[1:])],
            "state_bytes": size, "failed": sum(e["event"] == "resume_save_failed" for e in events)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/local.yaml")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--run-dirs", nargs="*", help="measure these run directories instead of starting runs")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.run_dirs:
        dirs = [Path(d) for d in args.run_dirs]
    else:
        out = Path(tempfile.mkdtemp(prefix="bench-periodic-"))
        dirs = [run_once(args.config, args.steps, out) for _ in range(args.reps)]
    runs = [measure(d) for d in dirs]
    saves = [s for r in runs for s in r["save_ms"]]
    steps = [s for r in runs for s in r["step_ms"]]
    if not saves or not steps:
        raise SystemExit(f"no resume_saved / train_step events in {[str(d) for d in dirs]}")
    save_ms, step_ms = statistics.median(saves), statistics.median(steps)
    result = {"saves": len(saves), "save_ms_median": round(save_ms, 2), "save_ms_max": round(max(saves), 2),
              "step_ms_median": round(step_ms, 1), "share_of_step": round(save_ms / step_ms, 5),
              "state_bytes_max": max(r["state_bytes"] for r in runs), "failed": sum(r["failed"] for r in runs),
              "runs": runs}
    print(json.dumps(result, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
