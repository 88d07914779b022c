#!/usr/bin/env bash
# Install mini-swe-agent (pinned, unmodified) in its OWN virtual environment: its dependencies (litellm,
# openai 3.x) conflict with SGLang's pins in the main environment. Idempotent: an existing venv with the pinned
# version is kept. The location is gyre_hpc.agents.mswea_venv's default (or $GYRE_MSWEA_VENV).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=2.4.6
VENV="${GYRE_MSWEA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gyre_hpc/venv-mswea-$VERSION}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('mini-swe-agent') != '$VERSION')" 2>/dev/null; then
  echo "mini-swe-agent $VERSION already in $VENV"; exit 0
fi
python -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "mini-swe-agent==$VERSION"
echo "mini-swe-agent $VERSION installed in $VENV"
