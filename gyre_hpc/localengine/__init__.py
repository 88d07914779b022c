"""The local rollout engine: the in-repo CPU double that speaks SGLang's HTTP protocol (``gyre_hpc.engines``).

- ``server``         the FastAPI server process (``python -m gyre_hpc.localengine.server``);
- ``scheduler``      continuous batching, abort, pause/retract, weight-version accounting;
- ``policy``         the megatron ``GPTModel`` the local engine generates from;
- ``sampling``       temperature / top-k / top-p sampling of one logit row;
- ``kvcache``        paged KV-cache bookkeeping; ``paged``, ``cached_forward``: decode on that cache;
- ``kvexport``, ``kvprefix``, ``kvport``, ``kvroutes``  a run's KV blocks moved between engines (``/kv/*``);
- ``weight_routes``  the weight-update endpoints (disk, distributed, tensor).
"""
