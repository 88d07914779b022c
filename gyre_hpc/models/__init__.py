"""Hugging Face model directories in and out of the project's megatron-core ``GPTModel`` (edge: torch,
transformers, safetensors).

- ``init``           ``init_model``: a tiny random real-format model with a locally trained tokenizer;
- ``export``         a training checkpoint or run directory → an HF directory;
- ``check``          transformers' forward against megatron's, and the export round trip;
- ``chat_template``  the chat template the tiny models carry (pure).

The parts other layers need sit where those layers can reach them (issue 14): ``gyre_hpc.files.hf_config`` (pure: an HF
``config.json`` → the ``ModelConfig`` fields, read by ``config``) in the core, and ``gyre_hpc.train.hf_weights``
(the HF ⇄ megatron tensor mapping) and ``gyre_hpc.train.hf_io`` (HF directories) in ``train``.
"""
