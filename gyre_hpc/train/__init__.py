"""Training side (edge: torch, megatron-core): a megatron ``GPTModel`` trained on ``PackedBatch`` rows.

- ``cpu_compat``  patches that let megatron-core run without CUDA (applied only then);
- ``model``       process/model-parallel set-up and ``build_model`` (local layer spec);
- ``loss``        per-token pg / ppo losses gathered at each token's tree parent;
- ``step``        ``Trainer``: step, burst, state, weight export, atomic checkpoints (``checkpoint``).
"""
