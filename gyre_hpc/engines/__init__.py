"""Rollout engines behind one HTTP protocol (SGLang's), from the side that starts and talks to them.

- ``protocol``       request validation and answer shapes (pure), ``GenerateResult``;
- ``client``         ``EngineClient`` for any SGLang-protocol URL (the local engine or SGLang);
- ``launch``         start/stop an engine process (``python -m gyre_hpc.localengine.server`` or SGLang);
- ``children``       service child processes that never outlive their parent; ``leftovers``: ones a run left behind;
- ``weights``        the weights directory ``/update_weights_from_disk`` loads (trainer export);
- ``weight_sync``    weights into a running engine over ``/update_weights_from_distributed``;
- ``weight_tensor``  the tensor road (``/update_weights_from_tensor``, sender and engine on one host).

The in-repo CPU engine itself (the double that speaks SGLang's protocol) is ``gyre_hpc.localengine``.
"""
