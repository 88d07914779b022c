"""Benchmark: a batch job's submit-to-end seconds on the local SLURM cluster with ``batch_sched_delay=0`` (what
scripts/local-slurm.sh writes) against SLURM's default (3 s), interleaved on one private cluster.

The job is ``srun true`` on 4 nodes, polled by ``scontrol`` every 10 ms (benchmarks/bench_local_slurm.py's
baseline job). Between the two settings only the ``SchedulerParameters`` line of the cluster's slurm.conf
differs, switched by ``scontrol reconfigure``. The cluster is a second one (its own directory and port, no links),
so a cluster already running for the tests is left alone; it is stopped by PID at the end.

    python benchmarks/bench_slurm_batch_delay.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_local_slurm import job_seconds  # noqa: E402

LINE = "SchedulerParameters=batch_sched_delay=0"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--port", type=int, default=8917)
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-sched-", dir="/tmp")
    os.chmod(scratch, 0o755)
    env = {**os.environ, "GYRE_SLURM_DIR": f"{scratch}/slurm", "GYRE_SLURM_PORT": str(args.port),
           "GYRE_SLURM_LINKS": "0"}
    script = ["bash", str(ROOT / "scripts" / "local-slurm.sh")]
    subprocess.run(script + ["start"], env=env, check=True, capture_output=True)
    exports = dict(re.findall(r"export (\w+)=(\S+)", subprocess.run(script + ["env"], env=env, text=True,
                                                                     capture_output=True).stdout))
    os.environ["SLURM_CONF"] = exports["SLURM_CONF"]
    conf = Path(exports["SLURM_CONF"])
    text = conf.read_text()
    assert LINE in text, f"scripts/local-slurm.sh no longer writes {LINE}"
    settings = {"batch_sched_delay=0": text, "default (3 s)": text.replace(LINE, "")}
    times: dict[str, list[float]] = {k: [] for k in settings}
    try:
        for _ in range(args.repeats):
            for name, body in settings.items():
                conf.write_text(body)
                subprocess.run(["scontrol", "reconfigure"], check=True)
                time.sleep(1.0)  # let slurmctld finish re-reading its config
                times[name].append(job_seconds("srun true"))
    finally:
        subprocess.run(script + ["stop"], env=env, capture_output=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:22s} median {med[k]:.2f} s  (min {min(v):.2f}, max {max(v):.2f}, n={len(v)})")
    print(f"default / batch_sched_delay=0: {med['default (3 s)'] / med['batch_sched_delay=0']:.2f}x; "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
