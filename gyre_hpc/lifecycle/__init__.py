"""The process lifecycle of a live run (core: standard library, numpy and the core only): how a run stops, what
it saves to be resumed, which signal means what, and whether it is relaunched, requeued or fails.

``recovery`` holds the outcomes, the exit-code table, the typed stop reasons, the request-file names and the
relaunch / requeue rule (docs/reliability.md draws the state machine); ``resume`` the resume state on disk;
``early_signals`` and ``rank_signals`` the preemption signals of a process.
"""
