#!/usr/bin/env bash
# Install SGLang 0.5.23 into the active Python environment (called by `bash scripts/setup.sh --sglang`).
# The recipe measured in shared notes (sglang.md): sglang itself without its dependencies (it pins torch 2.14.1),
# then the dependencies it needs pinned so that torch 2.13.0, transformers 5.19.0 and tokenizers 0.23.2 stay; on a
# CPU-only torch, scripts/sglang_cpu_stubs (sgl_kernel, torchvision) are copied into site-packages
# (gyre_sglang_cpu_stubs/) and a .pth file puts that copy on the path: the stubs outlive the checkout that
# installed them (a .pth into a deleted clone broke every SGLang start of another checkout).
# Idempotent: when every package is already at its version, pip is not run (a second run: one torch import).
# `pip check` fails afterwards by design (sglang's pins); that is expected.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
SGLANG=sglang==0.5.23
# name==version (checked and installed as is) or bare name (any installed version will do)
DEPS=(transformers==5.19.0 tokenizers==0.23.2 triton orjson psutil pybase64 requests pillow starlette msgspec pyzmq
      IPython aiohttp dill apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 compressed-tensors==0.18.0 gguf uvicorn uvloop
      fastapi openai==2.8.0 partial_json_parser setproctitle einops jsonschema xgrammar==0.2.7 soundfile==0.13.1
      python-multipart)

# one interpreter start (importing torch takes seconds): line 1 torch's version, line 2 "cpu" or "cuda", then
# each requirement that is not installed at its version
probe=$("$PY" - "$SGLANG" "${DEPS[@]}" <<'PYEOF'
import importlib.metadata as md, sys, torch
print(torch.__version__.split("+")[0]); print("cpu" if torch.version.cuda is None else "cuda")
for req in sys.argv[1:]:
    name, _, want = req.partition("==")
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(req); continue
    if want and have != want:
        print(req)
PYEOF
)
torch_pin=$(echo "$probe" | sed -n 1p)
device=$(echo "$probe" | sed -n 2p)
missing=$(echo "$probe" | sed -n '3,$p')
if [ -n "$missing" ]; then
  echo "setup_sglang: installing $(echo "$missing" | wc -l) package(s) (torch stays $torch_pin)"
  cons=$(mktemp); trap 'rm -f "$cons"' EXIT
  echo "torch==$torch_pin" > "$cons"
  "$PY" -m pip install -q --no-deps -c "$cons" "$SGLANG"
  # pip then warns that sglang's pins are not met (torch 2.14.1, ...): expected, see the header
  "$PY" -m pip install -q -c "$cons" "${DEPS[@]}"
else
  echo "setup_sglang: sglang and its dependencies already installed"
fi

site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
pth="$site/gyre_sglang_cpu_stubs.pth"
if [ "$device" = cpu ]; then
  stubs="$site/gyre_sglang_cpu_stubs"
  tmp="$stubs.tmp.$$"
  rm -rf "$tmp" && cp -r scripts/sglang_cpu_stubs "$tmp" && rm -rf "$stubs" && mv "$tmp" "$stubs"
  [ "$(cat "$pth" 2>/dev/null)" = "$stubs" ] || echo "$stubs" > "$pth"
  echo "setup_sglang: CPU torch: stubs for sgl_kernel and torchvision on the path ($pth)"
else
  rm -rf "$pth" "$site/gyre_sglang_cpu_stubs"
  echo "setup_sglang: CUDA torch: install sgl-kernel and torchvision matching torch $torch_pin yourself (not done here)"
fi
# a cheap check (importing sglang itself takes 10-40 s): the stubs import, the pinned versions are there
"$PY" -c "import importlib.metadata as md, importlib.util
assert importlib.util.find_spec('sglang') is not None
if '$device' == 'cpu':
    import sgl_kernel, torchvision
print('setup_sglang: sglang', md.version('sglang'), '| torch', md.version('torch'), '| transformers',
      md.version('transformers'), '| tokenizers', md.version('tokenizers'))"
