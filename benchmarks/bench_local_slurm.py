"""Benchmark: how long scripts/local-slurm.sh takes, and what a job costs on the local cluster.

Measured (median of ``--repeats`` runs each, interleaved where possible):
- ``start`` when the cluster is already up (the idempotent check CI may run twice),
- ``stop`` and then ``start`` with the packages installed (wipe, munged, slurmctld, 4 slurmd, wait for idle),
- with ``--cold`` (root; changes the system): ``start`` on a machine without the packages. Each cold run purges
  exactly the packages the last cold install unpacked (read from /tmp/local-slurm-apt.log) and moves their .deb
  files out of apt's cache, so apt downloads them again; the files are put back afterwards. apt's package lists
  stay (``apt-get update`` is not part of the timing; the script runs it only when an install fails).
- job latency, submit to end as seen by ``scontrol`` (polled every 10 ms): ``srun true`` on 4 nodes
  (baseline) and ``srun --mpi=pmix`` of a 4-rank mpi4py allreduce on 4 nodes.

    python benchmarks/bench_local_slurm.py                 # warm start/stop + job latency, 5 repeats
    python benchmarks/bench_local_slurm.py --cold 2        # plus 2 cold starts (purges and reinstalls)
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [str(ROOT / "scripts" / "local-slurm.sh")]
APT_LOG = "/tmp/local-slurm-apt.log"
MPI_PROG = ("from mpi4py import MPI; w = MPI.COMM_WORLD; "
            "assert w.allreduce(1) == w.Get_size() == 4, w.Get_size()")


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
    return time.perf_counter() - t0


def job_seconds(wrap: str) -> float:
    t0 = time.perf_counter()
    job = subprocess.run(["sbatch", "--parsable", "-N4", "--ntasks-per-node=1", "-o", "/dev/null", "--wrap", wrap],
                         capture_output=True, text=True, check=True).stdout.strip()
    while True:
        out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
        state = re.search(r"JobState=(\S+)", out).group(1)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            if state != "COMPLETED":
                raise SystemExit(f"job {job} ({wrap}) ended {state}")
            return time.perf_counter() - t0
        time.sleep(0.01)


def cold_start() -> float:
    """Purge what the last cold install unpacked, hide its .debs, time ``start``, put the .debs back."""
    unpacked = sorted(set(re.findall(r"^Unpacking (\S+?)(?::amd64)? ", Path(APT_LOG).read_text(), re.M)))
    if not unpacked:
        raise SystemExit(f"{APT_LOG} lists no unpacked packages: run the first cold start by hand")
    subprocess.run(SCRIPT + ["stop"], capture_output=True, check=True)
    subprocess.run(["apt-get", "purge", "-y", "-q", *unpacked], capture_output=True, check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    hidden = tempfile.mkdtemp(prefix="gyre-debs-")
    debs = [d for p in unpacked for d in glob.glob(f"/var/cache/apt/archives/{p}_*.deb")]
    for d in debs:
        shutil.move(d, hidden)
    try:
        return timed(SCRIPT + ["start"])
    finally:
        for d in debs:
            if not os.path.exists(d):
                shutil.move(os.path.join(hidden, os.path.basename(d)), d)
        shutil.rmtree(hidden, ignore_errors=True)


def report(name: str, runs: list[float], base: float | None = None) -> None:
    med = statistics.median(runs)
    ratio = f"{med / base:8.2f}" if base else "       -"
    print(f"| {name:<38} | {med:8.2f} | {ratio} | {', '.join(f'{r:.2f}' for r in runs)} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cold", type=int, default=0, help="cold starts to run (purges and reinstalls packages)")
    args = ap.parse_args()
    if args.cold and os.geteuid() != 0:
        raise SystemExit("--cold needs root (apt-get purge/install)")
    cold = [cold_start() for _ in range(args.cold)]
    timed(SCRIPT + ["start"])
    running, stop, warm = [], [], []
    for _ in range(args.repeats):
        running.append(timed(SCRIPT + ["start"]))
        stop.append(timed(SCRIPT + ["stop"]))
        warm.append(timed(SCRIPT + ["start"]))
    plain, mpi = [], []
    job_seconds("true")  # warm-up
    for _ in range(args.repeats):
        plain.append(job_seconds("srun true"))
        mpi.append(job_seconds(f"srun --mpi=pmix {sys.executable} -c '{MPI_PROG}'"))
    print("| case | median s | ratio | runs (s) |\n|---|---|---|---|")
    base = statistics.median(warm)
    report("start, packages installed (baseline)", warm, base)
    if cold:
        report("start, no packages (cold)", cold, base)
    report("start, already running", running, base)
    report("stop", stop, base)
    jbase = statistics.median(plain)
    report("job: srun true, 4 nodes (baseline)", plain, jbase)
    report("job: srun --mpi=pmix mpi4py, 4 ranks", mpi, jbase)
    return 0


if __name__ == "__main__":
    sys.exit(main())
