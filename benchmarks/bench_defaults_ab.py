"""The default job with KV moves and sleeping engines off vs on (issue 31): is "on" the better default?

    python benchmarks/bench_defaults_ab.py --reps 3 --steps 8 --out runs/defaults_ab
    python benchmarks/bench_defaults_ab.py --render --out runs/defaults_ab      # re-render from records.json

Each repetition runs ``gyre train configs/local.yaml --json --set allocator.steps=N`` once per side, interleaved
in ABBA order over the repetitions (off on, on off, off on, ...), so the shared machine's load hits both alike;
the 1-minute load average before each run is recorded. The sides differ only in
``engine.kv_cache`` and ``engine.sleep_in_training`` (both false = "off", both true = "on"; ``--sides`` adds
``kv`` or ``sleep`` for one of the two alone).

Per run, from its summary (docs/runtime.md): ``wall_s``, the seconds from the first admission to the N-th
optimizer step (as live_policies.py: start-up left out), ``reward_first`` / ``reward_last``,
``prefix_hit_rate``, ``moves_by_kind``, ``runs_moved``, ``role_share`` (the role timeline's shares of cell-time;
``loading`` is the engines' restarts or wakes) and the median switch times. The report gives per side the median
over repetitions and the on/off ratio of each repetition's pair (measured back to back).

Writes --md (default benchmarks/results/defaults_ab.md); records.json, logs and run directories go into --out
(not committed).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.live_policies import _wait, step_time  # noqa: E402
from gyre_hpc.files.io import atomic_write_json, atomic_write_text  # noqa: E402

SIDES = {"off": (False, False), "on": (True, True), "kv": (True, False), "sleep": (False, True)}


def log(msg: str) -> None:
    print(f"[defaults-ab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_one(args, side: str, rep: int) -> dict:
    kv, sleep = SIDES[side]
    name = f"{side}-r{rep}"
    sets = [f"allocator.steps={args.steps}", f"engine.kv_cache={str(kv).lower()}",
            f"engine.sleep_in_training={str(sleep).lower()}", f"run.out_dir={args.out / 'runs'}", f"run.name={name}",
            *args.set]
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(args.config), "--json"]
    for s in sets:
        cmd += ["--set", s]
    errlog = args.out / "logs" / f"{name}.log"
    errlog.parent.mkdir(parents=True, exist_ok=True)
    rec = {"side": side, "rep": rep, "load_before": round(os.getloadavg()[0], 2)}
    t0 = time.perf_counter()
    with open(errlog, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        out = _wait(proc, errlog, args.run_timeout_s, name)
    rec["process_s"] = round(time.perf_counter() - t0, 2)
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        progress = [x for x in errlog.read_text(errors="replace").splitlines() if x.startswith("[gyre")]
        late = rec["process_s"] >= args.run_timeout_s
        rec["error"] = (f"over --run-timeout-s {args.run_timeout_s:g} s, interrupted at "
                        f"'{progress[-1].split('|')[0].strip() if progress else 'start'}'" if late else
                        f"exit {proc.returncode}; see {errlog}")
        return rec
    s = json.loads(lines[-1])
    first_to_n, _ = step_time(Path(s["run_dir"]), args.steps)
    rec.update({k: s.get(k) for k in ("wall_s", "steps", "reward_first", "reward_last", "prefix_hit_rate",
                                      "moves_by_kind", "runs_moved", "runs_lost", "kv_move_median_s",
                                      "role_share", "switch_s", "engine_restarts", "run_dir")})
    rec["admission_to_last_step_s"] = first_to_n
    return rec


def order(reps: int, sides: list[str]) -> list[tuple[str, int]]:
    """ABBA: even repetitions run the sides in order, odd ones reversed."""
    return [(side, r) for r in range(reps) for side in (sides if r % 2 == 0 else sides[::-1])]


def _med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 4) if xs else None


def render(records: list[dict], sides: list[str], args) -> str:
    ok = [r for r in records if "error" not in r]
    ok = [r for i, r in enumerate(ok) if (r["side"], r["rep"]) not in {(x["side"], x["rep"]) for x in ok[i + 1:]}]
    rows = ["| side | runs | wall_s | admission→last step s | reward first→last | prefix hit rate | moves kv / "
            "reprefill (runs moved) | role_share loading / train / rollout | engine_start s / engine_wake s | "
            "load before |", "|---|---|---|---|---|---|---|---|---|---|"]
    for side in sides:
        rs = [r for r in ok if r["side"] == side]
        if not rs:
            continue
        kv = [(r["moves_by_kind"] or {}).get("kv") or 0 for r in rs]
        rp = [(r["moves_by_kind"] or {}).get("reprefill") or 0 for r in rs]
        share = lambda k: _med([(r.get("role_share") or {}).get(k) for r in rs])  # noqa: E731
        sw = lambda k: _med([(r.get("switch_s") or {}).get(k) for r in rs])  # noqa: E731
        rows.append(
            f"| {side} | {len(rs)} | {_med([r['wall_s'] for r in rs])} ({', '.join(str(r['wall_s']) for r in rs)}) "
            f"| {_med([r['admission_to_last_step_s'] for r in rs])} "
            f"| {_med([r['reward_first'] for r in rs])} → {_med([r['reward_last'] for r in rs])} "
            f"| {_med([r['prefix_hit_rate'] for r in rs])} "
            f"| {sum(kv)} / {sum(rp)} ({sum(r['runs_moved'] or 0 for r in rs)}) "
            f"| {share('loading')} / {share('train')} / {share('rollout')} "
            f"| {sw('engine_start')} / {sw('engine_wake')} "
            f"| {', '.join(str(r['load_before']) for r in rs)} |")
    lines = [f"# Default job, KV moves + sleeping engines off vs on ({time.strftime('%Y-%m-%d')})", "",
             f"`python benchmarks/bench_defaults_ab.py --reps {args.reps} --steps {args.steps} "
             f"--sides {' '.join(sides)}` on configs/local.yaml; ABBA order; medians over repetitions "
             "(per-run values in parentheses). Machine: 2 shared cores (other jobs running).", "", *rows, ""]
    base = sides[0]
    for side in sides[1:]:
        ratios = []
        for r in sorted({x["rep"] for x in ok}):
            a = next((x for x in ok if x["rep"] == r and x["side"] == base), None)
            b = next((x for x in ok if x["rep"] == r and x["side"] == side), None)
            if a and b and a["wall_s"] and b["wall_s"]:
                ratios.append(round(b["wall_s"] / a["wall_s"], 3))
        if ratios:
            lines.append(f"- wall time {side}/{base} per repetition: {', '.join(map(str, ratios))}; "
                         f"median **{_med(ratios)}** (< 1: {side} is faster)")
    failed = [r for r in records if "error" in r]
    if failed:
        lines.append("- failed runs: " + ", ".join(f"{r['side']}-r{r['rep']} ({r['error']})" for r in failed))
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "local.yaml")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--sides", nargs="+", default=["off", "on"], choices=list(SIDES))
    p.add_argument("--set", action="append", default=[], help="more overrides, alike for every side")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "defaults_ab")
    p.add_argument("--md", type=Path, default=ROOT / "benchmarks" / "results" / "defaults_ab.md")
    p.add_argument("--run-timeout-s", type=float, default=900.0)
    p.add_argument("--render", action="store_true", help="only re-render --md from OUT/records.json")
    p.add_argument("--resume", action="store_true", help="keep OUT/records.json; run only (side, rep) pairs "
                                                         "without a successful record (failed ones are kept)")
    args = p.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "records.json"
    records = json.loads(store.read_text()) if (args.render or args.resume) and store.exists() else []
    if not args.render:
        done = {(r["side"], r["rep"]) for r in records if "error" not in r}
        for side, rep in order(args.reps, args.sides):
            if (side, rep) in done:
                continue
            log(f"{side} rep {rep} (load {os.getloadavg()[0]:.1f})")
            rec = run_one(args, side, rep)
            keys = ("wall_s", "reward_last", "prefix_hit_rate", "moves_by_kind", "error")
            log(f"  -> {json.dumps({k: rec.get(k) for k in keys})}")
            records.append(rec)
            atomic_write_json(store, records)
    text = render(records, args.sides, args)
    atomic_write_text(args.md, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
