"""Training side (edge: torch, megatron-core): a megatron ``GPTModel`` trained on ``PackedBatch`` rows.

- ``cpu_compat``  patches that let megatron-core run without CUDA (applied only then);
- ``model``       process/model-parallel set-up and ``build_model`` (local layer spec);
- ``loss``        per-token pg / ppo losses gathered at each token's tree parent;
- ``step``        ``Trainer``: step, burst, state, weight export, atomic checkpoints (``checkpoint``);
- ``hf_weights``  the one name/layout mapping table, HF tensors ⇄ megatron tensors (TP slices on load);
- ``hf_io``       read and write HF directories (safetensors, tokenizer files, generation config).
"""
import warnings

# megatron-core warns at import, once per module, that TransformerEngine/Apex are absent; on the CPU that is the
# expected configuration (docs/training.md), and four copies per process drown the progress line.
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")

# megatron-core's fused functions compile when first called, not at its import (gyre_hpc/train/lazy_compile.py)
from gyre_hpc.train import lazy_compile  # noqa: E402

lazy_compile.install()
