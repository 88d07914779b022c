"""Hugging Face model directories in and out of the project's megatron-core ``GPTModel``.

- ``hf_config``  (pure) an HF ``config.json`` → the ``ModelConfig`` fields; supported architectures;
- ``weights``    the one name/layout mapping table, HF tensors ⇄ megatron tensors (TP slices on load);
- ``hf_io``      read and write HF directories (safetensors, tokenizer files, generation config);
- ``init``       ``init_model``: a tiny random real-format model with a locally trained tokenizer;
- ``export``     a training checkpoint or run directory → an HF directory;
- ``check``      transformers' forward against megatron's, and the export round trip.

Only ``hf_config`` belongs to the pure core; the others are edge modules (torch, transformers, safetensors).
"""
