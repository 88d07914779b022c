"""CPU stub of ``sgl_kernel`` (SGLang's CUDA kernel package) for SGLang 0.5.23 on a CPU-only machine.

Why: with SGLANG_USE_CPU_ENGINE=1 SGLang still imports eight ``*_cpu`` ops (copy_all_layer_kv_cache_cpu,
assign_req_to_token_pool_cpu, ...) and ``sgl_kernel.scalar_type.scalar_types`` at import time, and never calls them
for a dense model with the torch_native attention backend. The package on the index is a CUDA build that fails to
load here (libnvrtc.so.12 missing). Every attribute resolves to a placeholder; calling one raises.
"""
from gyre_cpu_stub import install_stub

install_stub(__name__)
