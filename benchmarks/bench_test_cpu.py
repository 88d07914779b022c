"""Wall seconds and CPU seconds of a test command (issue 14 item 6: is the serial test group CPU-bound or waiting?).

    python benchmarks/bench_test_cpu.py [--every 0.5] [--json OUT] -- python -m pytest tests/integration/x.py -q

Runs the command and, every ``--every`` seconds, reads /proc: the user+system CPU of every process that descends
from the command or from a local SLURM daemon (slurmd/slurmstepd: the processes of SLURM jobs are not the
command's descendants). A process's CPU is the last value read before it ended, so processes that live shorter
than one sampling interval are missed (an underestimate). Prints wall seconds, CPU seconds and their ratio, the
mean number of busy cores: on a 2-core machine a ratio near 2 means CPU-bound (running two such groups side by side
cannot help), well under 1 means mostly waiting (overlapping it with CPU-bound tests would).

``--top N`` also prints the CPU seconds of the N largest kinds of process (a kind: the command line's program
and module, e.g. ``python -m gyre_hpc.localengine.server``; a live run's ranks apart: ``(rank 0)``, ``(cell rank)``), to
see where a test's CPU goes.

Only meaningful when nobody else's SLURM jobs run on the local cluster during the measurement (else --no-slurm).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def snapshot() -> dict[int, tuple[int, str, int, float]]:
    """pid -> (ppid, comm, starttime, cpu seconds of the process itself)."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        # fields[0] is state (field 3); ppid is field 4, utime 14, stime 15, starttime 22
        procs[int(name)] = (int(fields[1]), comm, int(fields[19]), (int(fields[11]) + int(fields[12])) / TICK)
    return procs


def kind(pid: int) -> str:
    """A process's kind: its program, with the module or script a Python process runs (``-m X`` or a .py)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not args:
        return "?"
    prog = os.path.basename(args[0])
    if prog.startswith("python") and "--run-dir" in args:  # a rank of a live run: rank 0 apart from the cells
        return f"{_python_kind(args)} ({'rank 0' if _mpi_rank(pid) == '0' else 'cell rank'})"
    if prog.startswith("python"):
        for i, a in enumerate(args[1:], 1):
            if a == "-m" and i + 1 < len(args):
                return f"python -m {args[i + 1]}" + (f" {args[i + 2]}" if i + 2 < len(args) and
                                                      not args[i + 2].startswith("-") else "")
            if a.endswith(".py"):
                return f"python {os.path.basename(a)}"
            if a == "-c":
                return "python -c"
    return prog


def _python_kind(args: list[str]) -> str:
    for i, a in enumerate(args[1:], 1):
        if a == "-m" and i + 1 < len(args):
            return f"python -m {args[i + 1]}" + (f" {args[i + 2]}" if i + 2 < len(args) and
                                                  not args[i + 2].startswith("-") else "")
    return os.path.basename(args[0])


def _mpi_rank(pid: int) -> str | None:
    """The MPI rank in a process's environment (Open MPI's or SLURM's), None if unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    except OSError:
        return None
    got = env.get(b"OMPI_COMM_WORLD_RANK") or env.get(b"PMIX_RANK") or env.get(b"SLURM_PROCID")
    return got.decode() if got is not None else None


def descendants(procs: dict, roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in procs.items():
        children.setdefault(ppid, []).append(pid)
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, ()))
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=0.5, help="sampling interval in seconds")
    parser.add_argument("--json", help="also write the result to this file")
    parser.add_argument("--no-slurm", action="store_true",
                        help="count only the command's descendants (someone else's SLURM jobs are running)")
    parser.add_argument("--top", type=int, default=0, help="print the CPU seconds of the N largest process kinds")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("give the command after --")
    cpu: dict[tuple[int, int], float] = {}  # (pid, starttime) -> last CPU seconds read
    kinds: dict[tuple[int, int], str] = {}  # (pid, starttime) -> kind, read when first seen
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    while True:
        procs = snapshot()
        slurm = set() if args.no_slurm else {pid for pid, (_, comm, _, _) in procs.items()
                                             if comm in ("slurmd", "slurmstepd")}
        for pid in descendants(procs, {proc.pid} | slurm) - slurm:
            _, _, start, used = procs[pid]
            cpu[(pid, start)] = used
            if args.top and (pid, start) not in kinds:
                kinds[(pid, start)] = kind(pid)
        if proc.poll() is not None:
            break
        time.sleep(args.every)
    wall = time.monotonic() - t0
    total = sum(cpu.values())
    result = {"command": " ".join(cmd), "returncode": proc.returncode, "wall_s": round(wall, 1),
              "cpu_s": round(total, 1), "busy_cores": round(total / wall, 2), "processes": len(cpu),
              "load_avg_1m_at_end": os.getloadavg()[0]}
    if args.top:
        by_kind: dict[str, list[float]] = {}
        for key, used in cpu.items():
            by_kind.setdefault(kinds.get(key, "?"), []).append(used)
        top = sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))[:args.top]
        result["top"] = [{"kind": k, "cpu_s": round(sum(v), 1), "processes": len(v)} for k, v in top]
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
