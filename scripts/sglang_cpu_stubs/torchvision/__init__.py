"""CPU stub of ``torchvision`` for SGLang 0.5.23 on a CPU-only machine.

Why: sglang/srt/multimodal/internvl_utils.py imports torchvision unconditionally, and the torchvision wheels on the
index are built against a different torch (``operator torchvision::nms does not exist`` with torch 2.13.0+cpu).
Text-only models never use it. Every attribute resolves to a placeholder; calling one raises.
``__version__`` is "0.0.0": transformers 5.19 finds this package (importlib.util.find_spec), finds no metadata,
imports it and parses ``__version__``; the lowest version keeps it on its PIL code paths.
"""
from gyre_cpu_stub import install_stub

__version__ = "0.0.0"

install_stub(__name__)
