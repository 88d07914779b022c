"""Live staleness sweep: every policy at E[d] targets 0.5, 1, 1.5, 2 on a short live workload; time to N steps
and final reward side by side (table + PNG). The live counterpart of benchmarks/sim_staleness_sweep.py (issue 13).

    python benchmarks/live_staleness_sweep.py --config configs/bench/live_genbound.yaml --steps 4 --reps 1 \
        --overlay runs/genbound-tuned.yaml --out runs/live_sweep
    python benchmarks/live_staleness_sweep.py --render --out runs/live_sweep     # re-render from records.json

Each repetition runs, for every target, every policy once, interleaved (target-major, policies inner:
t0.5 g c a, t1 g c a, ...), so that the shared machine's load hits every policy alike; the 1-minute load
average before each run is recorded and printed. Only ``scheduler.staleness_target`` and ``scheduler.policy``
change between runs; every other knob is the config's (or the ``gyre tune`` overlay's), alike for all.

Per run, from its run directory and summary (docs/runtime.md): seconds from the first admission to the N-th
optimizer step (as live_policies.py), the measured E[d] (``staleness_mean``) and the reward of the last step's
batch (``reward_last``). With few steps the reward is noisy; it shows whether more off-policy data hurts
learning at this horizon, not a learning curve.

Writes benchmarks/results/live_staleness_sweep.md and .png (--md / --png); records.json, logs and run
directories go into --out (not committed).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.live_policies import _wait, step_time  # noqa: E402
from gyre_hpc.allocator.staleness import MATCH_TOLERANCE, comparable  # noqa: E402
from gyre_hpc.files.io import atomic_write_json, atomic_write_text  # noqa: E402
from gyre_hpc.report import compare  # noqa: E402

POLICIES = ("gyre", "colocate", "async")


def log(msg: str) -> None:
    print(f"[live-sweep {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_one(args, policy: str, target: float, rep: int) -> dict:
    """One live run at ``target``; returns its record (summary, step time, E[d], reward) or an error."""
    name = f"{policy}-t{target:g}-r{rep}"
    sets = [f"scheduler.policy={policy}", f"scheduler.staleness_target={target}", f"allocator.steps={args.steps}",
            f"run.out_dir={args.out / 'runs'}", f"run.name={name}", *args.set]
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(args.config), "--json"]
    for s in sets:
        cmd += ["--set", s]
    errlog = args.out / "logs" / f"{name}.log"
    errlog.parent.mkdir(parents=True, exist_ok=True)
    rec = {"policy": policy, "target": target, "rep": rep, "load_before": os.getloadavg()[0]}
    t0 = time.perf_counter()
    with open(errlog, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        out = _wait(proc, errlog, args.run_timeout_s, name)
    rec["elapsed_s"] = round(time.perf_counter() - t0, 2)
    try:
        summary = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        rec["error"] = f"exit {proc.returncode}, no JSON summary (see {errlog})"
        return rec
    run_dir = Path(summary["run_dir"])
    rec.update(run_dir=str(run_dir), step_s=step_time(run_dir, args.steps)[0], wall_s=summary["wall_s"],
               staleness_mean=summary.get("staleness_mean"), staleness_max=summary.get("staleness_max"),
               reward_first=summary.get("reward_first"), reward_last=summary.get("reward_last"),
               timed_out=compare.timed_out_share(summary), error=compare.invalid_reason(summary))
    return rec


def _ok(records: list[dict], policy: str, target: float) -> list[dict]:
    return [r for r in records if r["policy"] == policy and r["target"] == target
            and r.get("step_s") is not None and not r.get("error")]


def cell(records, policy, target) -> dict:
    """Medians over repetitions: step time, E[d], final reward; None where no run is valid."""
    ok = _ok(records, policy, target)
    return {"n": len(ok), "step_s": compare.median([r["step_s"] for r in ok]),
            "ed": compare.median([r["staleness_mean"] for r in ok]),
            "reward": compare.median([r["reward_last"] for r in ok if r.get("reward_last") is not None])}


def _f(x, nd=2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def table(data: dict) -> list[str]:
    pols, others = data["policies"], [p for p in data["policies"] if p != data["policies"][0]]
    ref = pols[0]
    head = ("| target E[d] | " + " | ".join(f"{p}: s to {data['steps']} steps (E[d]; final reward)" for p in pols)
            + " | " + " | ".join(f"{ref} x {p}" for p in others) + " |")
    lines = [head, "|---|" + "---|" * (len(pols) + len(others))]
    for t in data["targets"]:
        c = {p: cell(data["records"], p, t) for p in pols}
        cells = [f"{_f(c[p]['step_s'], 1)} ({_f(c[p]['ed'])}; {_f(c[p]['reward'], 3)})" for p in pols]
        ratios = []
        for p in others:
            if c[p]["step_s"] is None or c[ref]["step_s"] is None:
                ratios.append("–")
                continue
            held = all(c[q]["ed"] is not None and abs(c[q]["ed"] - t) <= MATCH_TOLERANCE * t + 1e-9 for q in (ref, p))
            same = comparable(c[ref]["ed"], c[p]["ed"])
            ratios.append(f"{c[p]['step_s'] / c[ref]['step_s']:.2f}"
                          + ("" if same else " (not comparable)") + ("" if held or not same else " (off target)"))
        lines.append(f"| {t:g} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return lines


def run_table(data: dict) -> list[str]:
    lines = ["| rep | target | policy | load (1 min) | s to N steps | run wall s | E[d] / max | reward first → last "
             "| timed out | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["records"]:
        lines.append(f"| {r['rep']} | {r['target']:g} | {r['policy']} | {_f(r.get('load_before'), 1)} | "
                     f"{_f(r.get('step_s'), 1)} | {_f(r.get('wall_s'), 1)} | {_f(r.get('staleness_mean'))} / "
                     f"{r.get('staleness_max', '–')} | {_f(r.get('reward_first'), 3)} → {_f(r.get('reward_last'), 3)} | "
                     f"{_pct(r.get('timed_out'))} | {r.get('error') or ''} |")
    return lines


def plot(data: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gyre_hpc.report.live_plots import save_png

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for p in data["policies"]:
        pts = [cell(data["records"], p, t) for t in data["targets"]]
        pts = [c for c in pts if c["step_s"] is not None]
        a1.plot([c["ed"] for c in pts], [c["step_s"] for c in pts], marker="o", label=p)
        a2.plot([c["ed"] for c in pts], [c["reward"] for c in pts], marker="o", label=p)
    for ax in (a1, a2):
        for t in data["targets"]:
            ax.axvline(t, color="0.85", lw=0.8, zorder=0)
        ax.set_xlabel("measured E[d] (targets: grey lines)")
        ax.grid(alpha=0.3)
    a1.set_ylabel(f"seconds to {data['steps']} optimizer steps")
    a2.set_ylabel("reward of the last step's batch")
    a1.set_title(f"live {Path(data['config']).stem}: time")
    a2.set_title("final reward")
    a1.legend(fontsize=8)
    return save_png(fig, path)  # atomic, like every plot of a run


def render(data: dict, md: Path, png: Path, notes: str = "") -> None:
    loads = [r["load_before"] for r in data["records"] if r.get("load_before") is not None]
    text = ["# Live staleness sweep: time and final reward at E[d] targets " +
            " / ".join(f"{t:g}" for t in data["targets"]), "",
            f"- Command: `python benchmarks/{' '.join(Path(a).name if i == 0 else a for i, a in enumerate(data['argv']))}`",
            f"- Date: {data['started']} – {data.get('finished', '(unfinished)')}",
            f"- Machine: 2 shared CPU cores (7 other engineers' jobs); 1-minute load average before the runs "
            f"{_f(min(loads, default=None), 1)}–{_f(max(loads, default=None), 1)}; runs interleaved per repetition "
            "(target-major, policies inner) so load hits all policies alike.",
            f"- Config `{Path(data['config']).name}`, {data['steps']} optimizer steps, {data['reps']} repetition(s); "
            f"extra settings for all alike: {', '.join(f'`{s}`' for s in data['sets']) or 'none'}.",
            f"- s = first admission → {data['steps']}-th optimizer step (events.jsonl). E[d] = the run's measured "
            f"mean staleness. Ratio = s(P) / s({data['policies'][0]}); marked not comparable where the two E[d] "
            f"differ by > {MATCH_TOLERANCE:.0%}, off target where either is > {MATCH_TOLERANCE:.0%} from the target.",
            "- Final reward: mean reward of the last step's trained batch, median over repetitions; with this few "
            "steps it varies by ±0.05 between seeds and batches, so read only large differences.", "",
            *table(data), "", f"![time and reward against measured E[d]]({png.name})", "", "Per run:", "",
            *run_table(data), ""]
    if notes:
        text += ["## Reading", "", notes.strip(), ""]
    atomic_write_text(md, "\n".join(text))
    plot(data, png)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "configs/bench/live_genbound.yaml")
    p.add_argument("--targets", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0])
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per run (default 4)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every run alike")
    p.add_argument("--overlay", type=Path, help="a gyre tune overlay, for every run alike (before --set)")
    p.add_argument("--out", type=Path, default=ROOT / "runs/live_sweep")
    p.add_argument("--md", type=Path, default=ROOT / "benchmarks/results/live_staleness_sweep.md")
    p.add_argument("--png", type=Path, default=ROOT / "benchmarks/results/live_staleness_sweep.png")
    p.add_argument("--run-timeout-s", type=float, default=420.0)
    p.add_argument("--notes", type=Path, help="markdown appended as '## Reading'")
    p.add_argument("--render", action="store_true", help="only re-render from OUT/records.json")
    p.add_argument("--resume", action="store_true", help="skip (policy, target, rep) already in records.json")
    args = p.parse_args(argv)
    if args.overlay:
        from gyre_hpc.config import overlay_overrides

        args.set = overlay_overrides(args.overlay) + args.set
    args.out = args.out.resolve()
    path = args.out / "records.json"
    notes = args.notes.read_text() if args.notes else ""
    if args.render:
        render(json.loads(path.read_text()), args.md, args.png, notes)
        return 0
    data = {"argv": sys.argv, "started": time.strftime("%Y-%m-%d %H:%M"), "config": str(args.config),
            "steps": args.steps, "reps": args.reps, "targets": args.targets, "policies": args.policies,
            "sets": args.set, "records": []}
    if args.resume and path.exists():
        data = json.loads(path.read_text())
    done = {(r["policy"], r["target"], r["rep"]) for r in data["records"] if "error" not in r or r.get("step_s")}
    for rep in range(1, args.reps + 1):
        for t in args.targets:
            for pol in args.policies:
                if (pol, t, rep) in done:
                    continue
                log(f"rep {rep} target {t:g} {pol}: starting (load {os.getloadavg()[0]:.1f})")
                rec = run_one(args, pol, t, rep)
                data["records"].append(rec)
                atomic_write_json(path, data)
                log(f"rep {rep} target {t:g} {pol}: {_f(rec.get('step_s'), 1)} s, E[d] {_f(rec.get('staleness_mean'))}"
                    f", reward {_f(rec.get('reward_last'), 3)} {rec.get('error') or ''}")
                render(data, args.md, args.png, notes)
    data["finished"] = time.strftime("%Y-%m-%d %H:%M")
    atomic_write_json(path, data)
    render(data, args.md, args.png, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
