"""Typed errors: every failure gyre_hpc raises on purpose is a ``GyreError``.

Each error carries the offending value in its message, and recovery happens in one place
(the allocator server, the cell runner, the command line), never scattered ``except`` blocks.
The command line turns a ``GyreError`` into a one-line message and exit status 2.
"""
from __future__ import annotations


class GyreError(Exception):
    """Base of every error gyre_hpc raises deliberately."""


class ConfigError(GyreError):
    """A configuration value, key, or file is invalid (the message names the dotted key)."""


class FieldError(ConfigError):
    """Raised by a section's ``check()``: ``key`` is relative to the section; the loader makes it dotted."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def require(condition: bool, key: str, message: str) -> None:
    """Raise ``FieldError(key, message)`` unless ``condition``; used inside ``check()`` methods."""
    if not condition:
        raise FieldError(key, message)


class TrajectoryError(GyreError):
    """A TITO log or trajectory is malformed (the message names file and line)."""


class WorkloadError(GyreError):
    """A simulator workload or trace is invalid."""


class SchedulingError(GyreError):
    """A scheduling policy was asked to do something its invariants forbid."""


class TransferError(GyreError):
    """A weight or KV-block transfer failed or delivered corrupt bytes."""


class CellLostError(GyreError):
    """A cell stopped answering (heartbeat missed, process died)."""


class ProtocolError(GyreError):
    """A message between the allocator and a cell (or an event-log line) is malformed or out of protocol.

    ``source`` is the MPI rank it came from when known (``None`` for local messages and files).
    """

    def __init__(self, message: str, source: int | None = None):
        super().__init__(message)
        self.source = source


class LayoutError(GyreError):
    """A cell layout does not fit the allocation."""


class EngineError(GyreError):
    """A rollout engine refused a request, answered out of protocol, or could not be reached.

    ``status`` is the HTTP status (``None`` when no answer came), ``endpoint`` the path that was called.
    """

    def __init__(self, message: str, status: int | None = None, endpoint: str | None = None):
        super().__init__(message)
        self.status = status
        self.endpoint = endpoint


class WeightSyncError(EngineError):
    """A weight push that failed ``retries`` times (the message holds each attempt's error)."""


class CheckpointError(GyreError):
    """A checkpoint directory is missing, incomplete, or was written by another parallel layout."""


class SlurmEnvError(GyreError):
    """A SLURM environment variable is malformed or contradicts another (the message names the variable)."""


class TaskError(GyreError):
    """A repository-repair task directory is malformed (the message names the task and the file)."""


class UnsupportedModelError(ConfigError):
    """A model directory holds an architecture (or a variant of one) the HF bridge does not map."""
