"""Experiment tracking (issue 29): one metrics sink, several backends (docs/runtime.md, "Experiment tracking").

- ``plan``: pure (stdlib only): the stable metric names, what a step logs, the resume reconcile.
- ``backends``: TensorBoard, W&B, MLflow behind the same five calls, each library imported lazily.
- ``sink``: ``Tracker``, one worker thread per backend; never blocks the caller, never fatal.
- ``live``: rank 0's tracker of a live run; ``sweep``: a sweep's grouped runs.
"""
