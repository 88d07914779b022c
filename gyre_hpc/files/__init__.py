"""What gyre_hpc writes and reads on disk; pure (standard library and ``errors`` only), below ``config``.

- ``io``         atomic outputs and run directories (a reader never sees a half-written file);
- ``jsonl``      the one JSON-lines reader (TITO logs, traces, run records);
- ``hf_config``  a Hugging Face ``config.json`` ↔ the fields of ``ModelConfig``.
"""
