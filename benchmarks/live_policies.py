"""Live three-policy benchmark: gyre vs colocate vs async on one machine, same workload, seed and staleness target.

Each repetition runs every policy once, interleaved (g, c, a, g, c, a, ...) so that the machine's background
load hits all of them alike, with

    python -m gyre_hpc.cli train CONFIG --json --set scheduler.policy=P --set allocator.steps=N ...

and nothing else changed between policies. Measured per run, from its run directory (docs/runtime.md):

- wall time to the N-th optimizer step (allocator clock; the simulator reports the same quantity) and the
  run's whole wall time; speedups = median over repetitions of wall(other) / wall(gyre);
- reward per step (side-by-side PNG) and staleness, to show the scheduler does not hurt learning;
- every switch's breakdown (cells/cell*.json), rollout->training and training->rollout apart;
- the satellites' Mooncake weight pulls (bytes / wire seconds), against a plain loopback-socket pull of a
  buffer of the same size measured right after the run in this process (gyre_hpc/transfer/socket.py);
- the simulator's replay prediction of the same run, when ``gyre simulate --trace RUN_DIR`` exists.

    python benchmarks/live_policies.py --steps 8 --reps 3 --out runs/bench_live
    python benchmarks/live_policies.py --render runs/bench_live     # re-render the results from records.json
    python benchmarks/live_policies.py --render --out runs/bench_live --json   # + per-policy JSON on stdout

Each policy's measured E[d] is printed beside its ratio; a ratio between policies whose E[d] differ by more
than 10% is marked "not comparable" (issue 13: comparisons at matched staleness).

Writes benchmarks/results/live_policies.md (--results) and, into --out (not committed): records.json, the
run directories, rewards.png and roles-<policy>-r<rep>.png.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.live_policies_report import json_summary, render  # noqa: E402
from gyre_hpc.errors import GyreError  # noqa: E402
from gyre_hpc.files.io import atomic_write_json  # noqa: E402
from gyre_hpc.report import compare  # noqa: E402

POLICIES = ("gyre", "colocate", "async")
ABLATIONS = ("async_streaming", "colocate_streaming")  # --policies gyre async_streaming: the streaming variants


def log(msg: str) -> None:
    print(f"[live-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def train_cmd(args, policy: str, rep: int) -> list[str]:
    sets = [f"scheduler.policy={policy}", f"allocator.steps={args.steps}", f"run.out_dir={args.out / 'runs'}",
            f"run.name={policy}-r{rep + 1}", *args.set]
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(args.config), "--json"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_train(args, policy: str, rep: int) -> dict:
    """One live run; returns its summary (or an error) and the process's elapsed seconds."""
    errlog = args.out / "logs" / f"{policy}-r{rep + 1}.log"
    errlog.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(errlog, "w") as err:
        proc = subprocess.Popen(train_cmd(args, policy, rep), stdout=subprocess.PIPE, stderr=err, text=True,
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        out = _wait(proc, errlog, args.run_timeout_s, f"{policy} rep {rep + 1}")
    rec = {"policy": policy, "rep": rep + 1, "elapsed_s": round(time.perf_counter() - t0, 2), "log": str(errlog)}
    try:
        rec["summary"] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        rec["error"] = f"exit {proc.returncode}, no JSON summary (see {errlog})"
    return rec


def _wait(proc: subprocess.Popen, errlog: Path, timeout_s: float, label: str) -> str:
    """Wait for ``proc``, relaying its last progress line every 20 s; SIGINT it after ``timeout_s``."""
    deadline, last = time.monotonic() + timeout_s, time.monotonic()
    while proc.poll() is None:
        time.sleep(1.0)
        if time.monotonic() - last >= 20:
            last = time.monotonic()
            lines = [x for x in errlog.read_text(errors="replace").splitlines() if x.startswith("[gyre")]
            log(f"  {label}: {lines[-1] if lines else 'starting'}")
        if time.monotonic() > deadline:
            log(f"  {label}: over {timeout_s:.0f} s, interrupting")
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return proc.stdout.read()


def step_time(run_dir: Path, steps: int) -> tuple[float | None, float | None]:
    """(seconds from the first admission to the ``steps``-th optimizer step, allocator-clock time of that
    admission); None if the run did not get there. Start-up (mpirun, imports, every cell's Hello) is left out:
    it is the same work for every policy and, on a loaded machine, mostly noise."""
    from gyre_hpc.allocator.eventlog import read_events

    events = read_events(run_dir / "events.jsonl")
    admit = next((e["t"] for e in events if e["event"] == "order" and e.get("order") == "admit"), None)
    ts = [e["t"] for e in events if e["event"] == "step"]
    if admit is None or len(ts) < steps:
        return None, admit
    return ts[steps - 1] - admit, admit


def socket_baseline(run_dir: Path, nbytes: int, pulls: int) -> dict:
    """Median GB/s of ``pulls`` loopback-socket pulls of ``nbytes`` (publisher in a spawned process)."""
    import dataclasses

    from gyre_hpc.config import load_config
    from gyre_hpc.transfer import make_puller
    from gyre_hpc.transfer.process import PublisherProcess

    cfg = dataclasses.replace(load_config(run_dir / "config.yaml").transfer, backend="socket")
    with PublisherProcess(cfg) as pub:
        desc = pub.publish(version=1, nbytes=nbytes, seed=0)
        puller = make_puller(cfg)
        try:
            puller.pull(desc)  # warm-up: connection set-up, page faults
            stats = [puller.pull(desc)[1] for _ in range(pulls)]
        finally:
            puller.close()
    return {"n": pulls, "bytes": stats[0].bytes, "checksum_ok": all(s.checksum_ok for s in stats),
            "gb_per_s": compare.median([s.bytes / s.seconds / 1e9 for s in stats])}


def simulate_available() -> bool:
    out = subprocess.run([sys.executable, "-m", "gyre_hpc.cli", "simulate", "--help"], capture_output=True,
                         text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return "--trace" in out.stdout


def simulate_trace(run_dir: Path) -> dict:
    """The simulator's replay of a live run: its predicted wall time (``gyre simulate --trace RUN_DIR``)."""
    out = subprocess.run([sys.executable, "-m", "gyre_hpc.cli", "simulate", "--trace", str(run_dir), "--json"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return {"predicted_s": _predicted_wall(data), "raw": data}


def _predicted_wall(data) -> float | None:
    """The replay's predicted span (first admission to the last optimizer step: what ``step_s`` measures)."""
    value = data.get("sim_span_s") if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def read_run(rec: dict, steps: int) -> dict:
    """Add what the run directory shows: step time, switches, Mooncake pulls, rewards."""
    run_dir = Path(rec["summary"]["run_dir"])
    cells = compare.read_cells(run_dir)
    rec["step_s"], rec["first_admit_t"] = step_time(run_dir, steps)
    rec["run_wall_s"] = rec["summary"]["wall_s"]
    rec["switch_list"] = [s for c in cells for s in c.get("switches", [])]
    rec["mooncake"] = compare.pull_throughput(compare.pulls(cells))
    rec["rewards"] = compare.reward_curve(run_dir)
    rec["error"] = compare.invalid_reason(rec["summary"])
    if isinstance(rec["summary"].get("sim_span_s"), (int, float)):  # the live run replayed itself
        rec["sim"] = {"predicted_s": rec["summary"]["sim_span_s"], "source": "summary.json"}
    return rec


def measure_run(args, rec: dict, sim: bool) -> dict:
    """``read_run``, then the socket baseline of the pulled size and the simulator's replay."""
    run_dir = Path(rec["summary"]["run_dir"])
    rec = read_run(rec, args.steps)
    if rec["mooncake"]["n"]:
        try:
            rec["socket"] = socket_baseline(run_dir, int(rec["mooncake"]["bytes"]), args.socket_pulls)
        except GyreError as exc:  # the baseline is an extra: a failure is recorded, the benchmark goes on
            rec["socket_error"] = str(exc)
    if sim and "sim" not in rec:
        rec["sim"] = simulate_trace(run_dir)
    roles = run_dir / "roles.png"
    if roles.exists():
        shutil.copy(roles, args.out / f"roles-{rec['policy']}-r{rec['rep']}.png")
    return rec


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "configs/bench/live_longtail.yaml",
                   help="the one config every policy runs (default: configs/bench/live_longtail.yaml)")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per run (allocator.steps); default 8")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every policy, interleaved; default 3")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES + ABLATIONS,
                   help="policies to compare; the first is the reference of the ratios (default: gyre colocate async)")
    p.add_argument("--out", type=Path, default=ROOT / "runs/bench_live",
                   help="folder for run directories, logs, records.json and plots (default runs/bench_live)")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks/results/live_policies.md",
                   help="markdown results file to write")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override applied to every policy alike (repeatable)")
    p.add_argument("--overlay", type=Path, metavar="FILE",
                   help="a gyre tune overlay applied to every policy alike (before --set); issue 13: benchmarks use "
                        "the defaults or gyre tune's knobs, never knobs hand-set for one policy")
    p.add_argument("--run-timeout-s", type=float, default=420.0, help="interrupt a run after this long (default 420)")
    p.add_argument("--socket-pulls", type=int, default=5, help="timed socket pulls per run for the baseline")
    p.add_argument("--retries", type=int, default=1,
                   help="rerun a run that failed (e.g. an engine not ready in time on a loaded machine); default 1")
    p.add_argument("--notes", type=Path, help="markdown file appended to the results as '## Reading'")
    p.add_argument("--render", action="store_true", help="only re-render --results from OUT/records.json")
    p.add_argument("--json", action="store_true",
                   help='also print {"policies": {NAME: {"wall_s", "staleness_mean", "staleness_target", '
                        '"reward_last"}}} (medians over repetitions) on stdout')
    p.add_argument("--resume", action="store_true",
                   help="continue OUT/records.json: run only the (policy, repetition) pairs it does not have yet")
    args = p.parse_args(argv)
    if args.steps < 1 or args.reps < 1:
        p.error("--steps and --reps must be >= 1")
    if not args.config.exists():
        p.error(f"--config {args.config}: no such file")
    if args.overlay:
        from gyre_hpc.config import overlay_overrides
        from gyre_hpc.errors import ConfigError

        try:
            args.set = overlay_overrides(args.overlay) + args.set
        except ConfigError as exc:
            p.error(f"--overlay: {exc}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    records_path = args.out / "records.json"
    if args.render:
        data = json.loads(records_path.read_text())
        data["records"] = [read_run(r, data["steps"]) if "summary" in r else r for r in data["records"]]
    else:
        data = {"argv": sys.argv, "started": time.strftime("%Y-%m-%d %H:%M"), "config": str(args.config),
                "steps": args.steps, "reps": args.reps, "policies": args.policies, "records": [],
                "sim_available": simulate_available()}
        if args.resume and records_path.exists():
            data = {**json.loads(records_path.read_text()), "sim_available": data["sim_available"]}
        done = {(r["policy"], r["rep"]) for r in data["records"] if "summary" in r}
        for rep in range(args.reps):
            for policy in args.policies:
                if (policy, rep + 1) in done:
                    continue
                log(f"rep {rep + 1}/{args.reps} {policy}: starting (load {os.getloadavg()[0]:.1f})")
                load = os.getloadavg()[0]
                rec = run_train(args, policy, rep)
                for attempt in range(args.retries):
                    if "summary" in rec:
                        break
                    log(f"rep {rep + 1}/{args.reps} {policy}: {rec['error']}; retrying")
                    rec = {**run_train(args, policy, rep), "failed_attempts": attempt + 1}
                rec["load_before"] = load
                if "summary" in rec:
                    rec = measure_run(args, rec, data["sim_available"])
                data["records"].append(rec)
                atomic_write_json(records_path, data)
                log(f"rep {rep + 1}/{args.reps} {policy}: " + (f"{args.steps} steps in {rec['step_s']} s (run "
                    f"{rec['summary']['wall_s']} s)" if "summary" in rec else "failed") +
                    (f"; left out of the comparison: {rec['error']}" if rec.get("error") else ""))
        data["finished"] = time.strftime("%Y-%m-%d %H:%M")
        atomic_write_json(records_path, data)
    render(data, args.out, args.results, args.notes.read_text() if args.notes else "")
    log(f"wrote {args.results} and {args.out / 'rewards.png'}")
    if args.json:
        from gyre_hpc.config import load_config

        target = load_config(args.config, args.set).scheduler.staleness_target
        print(json.dumps(json_summary(data, target)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
