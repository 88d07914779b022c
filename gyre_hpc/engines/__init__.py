"""Rollout engines behind one HTTP protocol (SGLang's): the in-repo ``local`` CPU engine and the engine client.

- ``protocol``   request validation and answer shapes (pure), ``GenerateResult``;
- ``sampling``   temperature / top-k / top-p sampling of one logit row;
- ``policy``     the megatron ``GPTModel`` the local engine generates from;
- ``weights``    the weights directory ``/update_weights_from_disk`` loads (trainer export);
- ``scheduler``  continuous batching, abort, pause/retract, weight-version accounting;
- ``local``      the FastAPI server process (``python -m gyre_hpc.engines.local``);
- ``launch``     start/stop a local engine process; ``client``: ``EngineClient`` for any SGLang-protocol URL.
"""
