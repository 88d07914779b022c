"""Where the sampled processes of a run spent their CPU, by process kind and phase (issue 14; the samples come from
benchmarks/oncpu/sitecustomize.py, see there for how to take them).

    python benchmarks/oncpu_report.py SAMPLE_DIR [--top 8]

Phases of a sample (its stack): ``import`` (inside importlib's bootstrap), ``tls`` (ssl.create_default_context),
``poll`` (an MPI improbe or the short sleep of a polling loop), ``train`` (the trainer's step or forward), ``plots``
(matplotlib), else ``other``. Prints, per kind, the processes' CPU seconds and each phase's share of the samples,
then the most sampled stacks outside imports.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os

PHASES = (("import", ("importlib._bootstrap",)), ("tls", ("ssl.py:create_default_context",)),
          ("poll", ("dataplane.py:poll", "mpi_transport.py:_get", "clock.py:sleep")),
          ("train", ("step.py:", "model.py:forward")), ("plots", ("matplotlib", "live_plots")))


def phase(stack: str) -> str:
    return next((name for name, marks in PHASES if any(m in stack for m in marks)), "other")


def kind(argv: list[str]) -> str:
    if "--run-dir" in argv:
        return "rank"
    if "-m" in argv:
        return argv[argv.index("-m") + 1]
    return os.path.basename(argv[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sample_dir")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args(argv)
    phases: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    stacks: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    cpu: collections.Counter = collections.Counter()
    procs: collections.Counter = collections.Counter()
    for path in glob.glob(os.path.join(args.sample_dir, "*.json")):
        with open(path) as f:
            d = json.load(f)
        k = kind(d.get("orig_argv") or d["argv"])
        cpu[k] += d["cpu"]
        procs[k] += 1
        for stack, n in d["counts"].items():
            phases[k][phase(stack)] += n
            if phase(stack) != "import":
                stacks[k][" < ".join(reversed(stack.split(";")[-4:]))] += n
    for k in sorted(cpu, key=lambda k: -cpu[k]):
        total = sum(phases[k].values()) or 1
        shares = "  ".join(f"{p} {100 * n / total:.0f}%" for p, n in phases[k].most_common())
        print(f"{k:32s} {procs[k]} processes {cpu[k]:6.1f} CPU s | {shares}")
        for stack, n in stacks[k].most_common(args.top):
            print(f"    {100 * n / total:4.0f}%  {stack}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
