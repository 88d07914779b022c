#!/usr/bin/env bash
# Run the whole test suite the way CI does: start the local SLURM cluster (4 emulated nodes; installs Debian's
# SLURM, munge, PMIx and Open MPI when missing, which needs root; SGLang too), run pytest, stop the cluster by PID.
# Usage: bash scripts/test.sh [pytest args...]
# Without arguments the whole suite runs in two groups (issue 14): first everything not marked mpi or slurm (or
# serial: timing-sensitive) in GYRE_TEST_WORKERS parallel xdist workers (default 2; one test file per worker at a
# time, so a module's engine starts once), then the mpi/slurm/serial tests (each already runs several processes)
# in two pytest invocations: the mpi and SLURM tests in GYRE_TEST_LIVE_WORKERS xdist workers (default 3; one
# module per worker at a time), then the `serial` ones alone
# (GYRE_TEST_OVERLAP=0: the whole second group in one pytest, one test at a time). The exit status is the first
# non-zero pytest status, in that order, else 0. With arguments: one plain pytest.
# Each invocation ends with its 25 slowest tests (--durations=25), so that CI logs show where the time goes.
set -uo pipefail
cd "$(dirname "$0")/.."
# the import contract first (issue 14): a new cycle or upward import fails before any test runs
lint-imports --no-cache || { echo "scripts/test.sh: the import contract (.importlinter) is broken" >&2; exit 1; }
# pytest caches its assertion-rewritten test modules in __pycache__ (ignored by git) unless Python is told not to
# write bytecode: with PYTHONDONTWRITEBYTECODE set (some images set it) each of the six collections below (one per
# xdist worker) rewrote all ~300 test modules again: 9.0 s a collection, 4.5 s cached (BENCHMARKS.md)
unset PYTHONDONTWRITEBYTECODE
started=0
if ! bash scripts/local-slurm.sh status >/dev/null 2>&1; then
  bash scripts/local-slurm.sh start || { echo "scripts/test.sh: the local SLURM cluster did not start" >&2; exit 1; }
  started=1
fi
stop() { [ "$started" = 1 ] && bash scripts/local-slurm.sh stop >/dev/null 2>&1; }
trap stop EXIT
# tests marked sglang start real SGLang servers: install it when missing (idempotent, ~2 min the first time)
# (on a CPU-only torch, whose version ends in +cpu, SGLang also needs the stubs setup_sglang.sh installs; both are
# found, not imported: importing SGLang costs ~6 s)
python -c "import importlib.metadata as m, importlib.util as u
raise SystemExit(not (u.find_spec('sglang') and ('+cpu' not in m.version('torch') or u.find_spec('torchvision'))))" \
  >/dev/null 2>&1 || bash scripts/setup.sh --sglang || { echo "scripts/test.sh: SGLang did not install" >&2; exit 1; }
# tests of agent.kind mini-swe-agent run the real package from its own venv: make it when missing (idempotent)
bash scripts/setup.sh --mini-swe-agent >/dev/null || { echo "scripts/test.sh: the mini-swe-agent venv did not install" >&2; exit 1; }
if [ "$#" -gt 0 ]; then
  python -m pytest "$@"
  exit $?
fi
python -m pytest -p xdist -n "${GYRE_TEST_WORKERS:-2}" --dist loadfile -m "not (mpi or slurm or serial)" --durations=25
rc=$?
if [ "${GYRE_TEST_OVERLAP:-1}" != 1 ]; then
  python -m pytest -m "mpi or slurm or serial" --durations=25
  rc2=$?
  exit $(( rc != 0 ? rc : rc2 ))
fi
# The overlap (issue 14): one live run keeps well under one of the two cores busy (start-ups, agents' tool sleeps,
# SLURM scheduling, polling), two side by side about 1.5 of them, so the mpi and SLURM tests run three at a time,
# each module whole on one worker (its module fixtures start once): 515 s against 596 s with two workers (medians
# of 2 runs, same commit, quiet machine; four: slower than three; BENCHMARKS.md). The 4-node cluster holds several
# tests' jobs at once (CR_Core, 4 CPUs a node, one task per node). The test that waits on SLURM's time limit
# (marked `waits`) is collected first, so that its wait overlaps the other tests, then the live SGLang modules
# (the longest: a server start is 1-2.5 minutes here; they ran in the serial group at 1.26 busy cores until
# 2026-12-03, tests/conftest.py). The timing-sensitive `serial` tests (agent harness, proxy) then run alone.
# --no-loadscope-reorder: xdist 3.8 otherwise hands out modules by their number of tests (most first), which put
# the time-limit and SGLang modules (1-4 tests each) last, ending the group alone on one worker
python -m pytest -p xdist -n "${GYRE_TEST_LIVE_WORKERS:-3}" --dist loadfile --no-loadscope-reorder \
  -m "(mpi or slurm) and not serial" --durations=25
rc2=$?
python -m pytest -m "serial" --durations=25
rc3=$?
for r in "$rc2" "$rc3"; do [ "$rc" = 0 ] && rc=$r; done
exit "$rc"
