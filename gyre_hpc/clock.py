"""The injected clock: everything that waits or stamps time takes a ``Clock``, never ``time`` directly.

``WallClock`` is real time (seconds since the clock was made, from ``time.monotonic``); ``ManualClock`` is
virtual time that moves only when someone sleeps on it or advances it, so a test of a polling loop with
timeouts runs instantly and deterministically. ``wall()`` is the clock's epoch stamp (seconds since 1970 for
``WallClock``, for records other processes compare: TITO call times, groups.jsonl); durations take ``now()``.
This module is the one place that calls ``time`` (tests/unit/test_clock_only.py holds the rest of gyre_hpc to it).

Invariants
- ``now()`` never decreases, for both clocks; ``ManualClock.wall()`` moves with its ``now()`` (from the epoch
  stamp ``wall0``, by default the real one when the clock was made), so it never decreases either.
- ``ManualClock.sleep(dt)`` advances ``now()`` by exactly ``dt``; a negative duration is a ``ValueError``
  (a caller computing a negative wait has a bug).
- ``ManualClock`` is safe to share between threads (one lock guards the time and the hooks).
- ``wait_until(predicate, timeout, clock)`` is the one wait loop: it calls ``predicate`` at least once, returns
  its first truthy value, and otherwise returns its last (falsy) value after a call made once ``timeout`` seconds
  of ``clock`` had passed; it never sleeps past the deadline, and all its time goes through ``clock``.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's time line."""

    def sleep(self, dt: float) -> None:
        """Wait ``dt`` seconds of this clock's time."""

    def wall(self) -> float:
        """An epoch stamp for records that other processes read (not for durations: take ``now()``)."""


class WallClock:
    """Real time: ``now()`` is seconds since construction (monotonic, immune to wall-clock jumps)."""

    def __init__(self, start: float = 0.0) -> None:
        self._t0 = time.monotonic() - start  # start: where the time line begins (a resumed run's last event)

    def now(self) -> float:
        return time.monotonic() - self._t0

    def wall(self) -> float:
        return time.time()

    def sleep(self, dt: float) -> None:
        if dt < 0:
            raise ValueError(f"cannot sleep a negative duration ({dt} s)")
        time.sleep(dt)


class ManualClock:
    """Virtual time for tests. ``on_sleep`` hooks run after every sleep (a scripted world acts there)."""

    def __init__(self, t0: float = 0.0, wall0: float | None = None) -> None:
        self._t = float(t0)
        self._wall0 = (time.time() if wall0 is None else float(wall0)) - self._t  # wall() at now() == 0
        self._lock = threading.RLock()
        self.on_sleep: list[Callable[[float], None]] = []
        self.slept: list[float] = []

    def now(self) -> float:
        with self._lock:
            return self._t

    def wall(self) -> float:
        return self._wall0 + self.now()

    def advance(self, dt: float) -> float:
        """Move time forward by ``dt`` without running the hooks; returns the new time."""
        if dt < 0:
            raise ValueError(f"cannot move a clock backwards ({dt} s)")
        with self._lock:
            self._t += dt
            return self._t

    def sleep(self, dt: float) -> None:
        with self._lock:
            now = self.advance(dt)
            self.slept.append(dt)
            for hook in list(self.on_sleep):
                hook(now)


def wait_until(predicate: Callable[[], T], timeout: float | None, clock: Clock | None = None, *,
               poll_s: float = 0.05, max_poll_s: float | None = None,
               idle: Callable[[], None] | None = None) -> T:
    """Call ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds of ``clock`` (default
    a new ``WallClock``; None: no limit) have passed (its last, falsy, value is returned). Between calls ``idle()``
    runs (heartbeats, draining) and the clock sleeps ``poll_s``, doubling up to ``max_poll_s`` when given."""
    clock = clock or WallClock()
    deadline = None if timeout is None else clock.now() + timeout
    sleep = poll_s
    while True:
        got = predicate()
        if got:
            return got
        if deadline is not None and clock.now() >= deadline:
            return got
        if idle is not None:
            idle()
        clock.sleep(sleep if deadline is None else max(0.0, min(sleep, deadline - clock.now())))
        if max_poll_s is not None:
            sleep = min(sleep * 2, max_poll_s)
