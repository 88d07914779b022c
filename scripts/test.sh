#!/usr/bin/env bash
# Run the whole test suite the way CI does: start the local SLURM cluster (4 emulated nodes; installs Debian's
# SLURM, munge, PMIx and Open MPI when missing, which needs root; SGLang too), run pytest, stop the cluster by PID.
# Usage: bash scripts/test.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
started=0
if ! bash scripts/local-slurm.sh status >/dev/null 2>&1; then
  bash scripts/local-slurm.sh start || { echo "scripts/test.sh: the local SLURM cluster did not start" >&2; exit 1; }
  started=1
fi
stop() { [ "$started" = 1 ] && bash scripts/local-slurm.sh stop >/dev/null 2>&1; }
trap stop EXIT
# tests marked sglang start real SGLang servers: install it when missing (idempotent, ~2 min the first time)
python -c "import sglang" >/dev/null 2>&1 || bash scripts/setup.sh --sglang || { echo "scripts/test.sh: SGLang did not install" >&2; exit 1; }
python -m pytest "$@"
