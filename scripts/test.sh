#!/usr/bin/env bash
# Run the whole test suite the way CI does: start the local SLURM cluster (4 emulated nodes; installs Debian's
# SLURM, munge, PMIx and Open MPI when missing, which needs root), run pytest, stop the cluster by PID.
# Usage: bash scripts/test.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
# the import contract first (issue 14): a new cycle or upward import fails before any test runs
lint-imports --no-cache || { echo "scripts/test.sh: the import contract (.importlinter) is broken" >&2; exit 1; }
started=0
if ! bash scripts/local-slurm.sh status >/dev/null 2>&1; then
  bash scripts/local-slurm.sh start || { echo "scripts/test.sh: the local SLURM cluster did not start" >&2; exit 1; }
  started=1
fi
stop() { [ "$started" = 1 ] && bash scripts/local-slurm.sh stop >/dev/null 2>&1; }
trap stop EXIT
python -m pytest "$@"
