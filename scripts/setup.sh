#!/usr/bin/env bash
# Install everything gyre_hpc needs on a fresh Debian machine (as root): Debian packages for Mooncake
# (libibverbs1), SLURM/munge/PMIx/Open MPI (via scripts/local-slurm.sh install), then the Python package with
# all backends. torch is pinned to the CPU wheel 2.13.0 so no multi-GB CUDA build is pulled.
# `bash scripts/setup.sh --sglang` installs only SGLang (and its CPU stubs) into the active environment
# (scripts/setup_sglang.sh); run it after the plain setup.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sglang" ]; then exec bash scripts/setup_sglang.sh; fi
if [ "${1:-}" = "--mini-swe-agent" ]; then exec bash scripts/setup_mswea.sh; fi   # its own venv (issue 11)
export DEBIAN_FRONTEND=noninteractive
if ! dpkg -s libibverbs1 >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends libibverbs1 >/dev/null   # Mooncake imports it even for TCP
fi
command -v patch >/dev/null || { apt-get update -qq && apt-get install -y -qq patch >/dev/null; }  # gyre tasks check
command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends curl ca-certificates >/dev/null; }  # README serve example, tests/integration/test_serve.py
bash scripts/local-slurm.sh install                                          # slurm, munge, pmix, openmpi-bin
python -m pip install -q torch==2.13.0
python -m pip install -q --only-binary=mpi4py "mpi4py>=4.1"                  # the wheel; never a source build
python -m pip install -q -e ".[dev]"
echo "gyre_hpc set up: try 'gyre --help'"
