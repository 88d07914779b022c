"""Chaos benchmark of a live run: random kills and preemptions, each followed by an automatic ``--resume``.

    python benchmarks/chaos_live.py --json [--config configs/local.yaml] [--steps 6] [--seed 0]
                                    [--engine-kills 2] [--preemptions 2] [--rank-kills 1] [--rank0-kills 0]

A seeded plan shuffles the faults: SIGKILL of an engine process (the run goes on: the cell restarts its engine),
SIGKILL of one whole cell rank (``gyre train`` relaunches the run itself from rank 0's resume state, live/lost.py
and live/supervise.py: the same command goes on, the lost cell starts again), SIGKILL of rank 0 itself
(``--rank0-kills``; once the segment trained a step: ``gyre train`` relaunches from rank 0's periodic state,
live/periodic.py), and a preemption (SIGTERM to
``gyre train``: exit 75 with the resume state). Each fault waits for a seeded step count of the current
``gyre train`` command plus a seeded delay. Only after exit 75 the benchmark starts ``gyre train --resume RUN_DIR``
at once, as SLURM's requeue would; any other exit ends the benchmark (exit 0: the run finished; 69 or 70: the
command gave up after ``run.max_relaunches``, the run is lost). 10 s after each command exited it counts the
processes of that command still alive (the check of benchmarks/security_probe.py).

There are no trainer-worker kills: the trainer runs inside its cell's rank (docs/reliability.md, "What a dead
trainer does"), so killing it is the rank kill.

It prints ``{"kills", "preemptions", "resumes_ok", "steps_done", "steps_target", "runs_lost",
"queries_reissued", "orphans_after_10s"}`` (``kills`` = engine + rank kills applied; ``resumes_ok`` = resumed
segments, the ``resumed`` events of the run, relaunches included; ``relaunches`` = those ``gyre train`` made
itself; ``runs_lost`` = agent runs the summary counts lost; ``run_lost`` 1 if the run never finished) and the
details (``faults``: each fault with its command (``segment``), step and outcome; ``segments``: each ``gyre train``
command's exit status). BENCHMARKS.md and docs/reliability.md record the result.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from security_probe import _alive, _role, _tree  # noqa: E402

#: the short 1 + 2 rank run of tests/integration/test_preempt_edges.py: steps seconds apart, so faults land mid-run
OVERRIDES = ["cluster.cells=2", "scheduler.policy=async", "scheduler.async_train_cells=1", "scheduler.batch_groups=2",
             "agent.runs_per_group=2", "agent.turns=[1, 2]", "allocator.hello_timeout_s=600",
             "allocator.heartbeat_timeout_s=300", "proxy.startup_timeout_s=180", "engine.startup_timeout_s=600",
             "agent.timeout_s=120", "agent.tool_time_median_s=1.0"]
#: the exit status after which the benchmark resumes (a preemption: SLURM would requeue); a lost rank is relaunched
#: by ``gyre train`` itself (run.max_relaunches), so its 69 or 70 means the run is lost
RESUMABLE = (75,)


def steps_done(run_dir: Path | None) -> int:
    path = run_dir / "metrics.jsonl" if run_dir else None
    return len(path.read_text().splitlines()) if path is not None and path.is_file() else 0


def find_run_dir(out_dir: Path) -> Path | None:
    dirs = [d for d in out_dir.iterdir() if (d / "config.yaml").is_file()] if out_dir.is_dir() else []
    return dirs[0] if dirs else None


def processes(launcher: subprocess.Popen, role: str) -> list[psutil.Process]:
    out = []
    for p in _tree(launcher.pid)[1:]:
        try:
            if _role(p) == role:
                out.append(p)
        except psutil.Error:
            continue
    return out


def cell_ranks(launcher: subprocess.Popen, root: bool = False) -> list[psutil.Process]:
    """The cells' ranks, or (``root``) rank 0."""
    out = []
    for p in processes(launcher, "rank"):
        try:
            if (p.environ().get("OMPI_COMM_WORLD_RANK", "0") == "0") == root:
                out.append(p)
        except psutil.Error:
            continue
    return out


def plan(rng: random.Random, engine_kills: int, preemptions: int, rank_kills: int, rank0_kills: int = 0) -> list[dict]:
    faults = ["engine"] * engine_kills + ["preempt"] * preemptions + ["rank"] * rank_kills + ["rank0"] * rank0_kills
    rng.shuffle(faults)
    return [{"kind": k, "after_steps": rng.randint(0, 1), "delay_s": round(rng.uniform(0.0, 4.0), 2)} for k in faults]


class Chaos:
    def __init__(self, args: argparse.Namespace):
        self.args, self.rng = args, random.Random(args.seed)
        self.out_dir = Path(tempfile.mkdtemp(prefix="gyre-chaos-"))
        self.run_dir: Path | None = None
        self.segments: list[dict] = []
        self.orphans = 0
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM", "PMI_"))}
        self.env.pop("GYRE_JOB_SECRET", None)
        self.env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), self.env.get("PYTHONPATH")) if x)

    def start(self) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", self.args.config, "--json",
               "--set", f"run.out_dir={self.out_dir}", "--set", "run.name=chaos",
               "--set", f"allocator.steps={self.args.steps}"] + [a for o in OVERRIDES for a in ("--set", o)]
        if self.run_dir is not None:
            cmd += ["--resume", str(self.run_dir)]
        log = open(self.out_dir / f"segment{len(self.segments)}.log", "wb")  # noqa: SIM115 (closed in end())
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True)
        proc.log = log
        self.pids: set[int] = set()
        return proc

    def watch(self, proc: subprocess.Popen) -> None:
        self.pids |= {p.pid for p in _tree(proc.pid)}
        if self.run_dir is None:
            self.run_dir = find_run_dir(self.out_dir)

    def wait_for(self, proc: subprocess.Popen, steps: int, delay_s: float) -> bool:
        """Until ``steps`` steps are done (and ``delay_s`` more); False if the segment ended first."""
        while proc.poll() is None and steps_done(self.run_dir) < steps:
            self.watch(proc)
            time.sleep(0.2)
        t = time.monotonic()
        while proc.poll() is None and time.monotonic() - t < delay_s:
            self.watch(proc)
            time.sleep(0.1)
        return proc.poll() is None

    def resumed(self) -> int:
        """``resumed`` events so far (a relaunched or resumed segment's rank 0 writes one when it starts)."""
        from gyre_hpc.allocator.eventlog import read_events
        from gyre_hpc.errors import GyreError

        path = self.run_dir / "events.jsonl" if self.run_dir else None
        try:
            return sum(e["event"] == "resumed" for e in read_events(path)) if path and path.is_file() else 0
        except GyreError:
            return 0

    def wait_relaunched(self, proc: subprocess.Popen, resumed: int) -> None:
        """After a rank kill: until ``gyre train`` relaunched the run and its rank 0 resumed (or the command ended)."""
        while proc.poll() is None and self.resumed() <= resumed:
            self.watch(proc)
            time.sleep(0.2)

    def apply(self, proc: subprocess.Popen, fault: dict) -> bool:
        """Apply ``fault`` to the running segment; True if it was applied."""
        if fault["kind"] == "preempt":
            proc.send_signal(signal.SIGTERM)
            return True
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            self.watch(proc)
            targets = (processes(proc, "engine") if fault["kind"] == "engine"
                       else cell_ranks(proc, root=fault["kind"] == "rank0"))
            if targets:
                victim = self.rng.choice(sorted(targets, key=lambda p: p.pid))
                try:
                    fault["target"] = (victim.environ().get("OMPI_COMM_WORLD_RANK") if fault["kind"] != "engine"
                                       else " ".join(victim.cmdline()[-4:]))
                    victim.kill()
                except psutil.Error:
                    continue
                return True
            time.sleep(0.5)
        return False

    def end(self, proc: subprocess.Popen) -> int:
        code = proc.wait(self.args.timeout)
        proc.log.close()
        ended = time.monotonic()
        left = list(self.pids)
        while time.monotonic() - ended < 10.0:
            left = [pid for pid in self.pids if _alive(pid)]
            if not left:
                break
            time.sleep(0.2)
        self.orphans += len(left)
        self.segments.append({"exit": code, "steps_done": steps_done(self.run_dir), "orphans_after_10s": len(left)})
        return code

    def run(self) -> dict:
        faults = plan(self.rng, self.args.engine_kills, self.args.preemptions, self.args.rank_kills,
                      self.args.rank0_kills)
        pending = list(faults)
        t0 = time.monotonic()
        while len(self.segments) < self.args.max_segments and time.monotonic() - t0 < self.args.timeout:
            proc = self.start()
            while pending and proc.poll() is None:
                fault = pending[0]
                base = steps_done(self.run_dir)
                # an engine is killed once the segment trains (engines serve); a preemption or a rank kill may
                # also land while the segment is still starting (after_steps 0 of a resumed segment); rank 0
                # once the segment saved a periodic state (a step), else there is nothing newer to relaunch from
                after = max(fault["after_steps"], 1) if fault["kind"] in ("engine", "rank0") else fault["after_steps"]
                target = min(base + after, self.args.steps - 1)
                if base >= self.args.steps - 1 or not self.wait_for(proc, max(target, 1), fault["delay_s"]):
                    break  # the run is at its last step, or the segment ended: the fault waits for the next one
                pending.pop(0)
                resumed = self.resumed()
                fault.update(segment=len(self.segments), at_step=steps_done(self.run_dir),
                             applied=self.apply(proc, fault))
                if fault["kind"] in ("rank", "rank0") and fault["applied"]:
                    self.wait_relaunched(proc, resumed)  # the next fault lands on the relaunched ranks
                if fault["kind"] == "preempt":
                    break  # the command ends: the rest wait for the next one (a rank kill is relaunched inside)
            while proc.poll() is None:
                self.watch(proc)
                time.sleep(0.5)
            code = self.end(proc)
            resumable = self.run_dir is not None and (self.run_dir / "resume" / "state.json").is_file()
            if code == 0 or code not in RESUMABLE or not resumable:
                break
        return self.report(faults)

    def report(self, faults: list[dict]) -> dict:
        from gyre_hpc.allocator.eventlog import read_events

        summary_path = self.run_dir / "summary.json" if self.run_dir else None
        summary = json.loads(summary_path.read_text()) if summary_path and summary_path.is_file() else {}
        events = read_events(self.run_dir / "events.jsonl") if self.run_dir else []
        applied = [f for f in faults if f.get("applied")]
        return {
            "kills": sum(f["kind"] in ("engine", "rank", "rank0") for f in applied),
            "preemptions": sum(f["kind"] == "preempt" for f in applied),
            "resumes_ok": sum(e["event"] == "resumed" for e in events),
            "steps_done": summary.get("steps", steps_done(self.run_dir)), "steps_target": self.args.steps,
            "runs_lost": summary.get("runs_lost"), "queries_reissued": summary.get("queries_reissued"),
            "orphans_after_10s": self.orphans,
            "run_lost": int(not summary), "engine_kills": sum(f["kind"] == "engine" for f in applied),
            "rank_kills": sum(f["kind"] == "rank" for f in applied),
            "rank0_kills": sum(f["kind"] == "rank0" for f in applied),
            "engine_restarts": sum(e["event"] == "engine_restarted" for e in events),
            "rank_lost_events": sum(e["event"] == "rank_lost" for e in events),
            "relaunches": sum(e["event"] == "relaunched" for e in events),
            "error_segments": sum(seg["exit"] == 70 for seg in self.segments),
            "faults": faults, "segments": self.segments, "seed": self.args.seed, "run_dir": str(self.run_dir),
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "local.yaml"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine-kills", type=int, default=2)
    p.add_argument("--preemptions", type=int, default=2)
    p.add_argument("--rank-kills", type=int, default=1, help="SIGKILLs of a cell's rank")
    p.add_argument("--rank0-kills", type=int, default=0, help="SIGKILLs of rank 0 (relaunched from its periodic state)")
    p.add_argument("--max-segments", type=int, default=8)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds the whole benchmark may take")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out = Chaos(args).run()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0 if not out["run_lost"] else 1


if __name__ == "__main__":
    sys.exit(main())
