"""Every wait and every time stamp in gyre_hpc and in its entry points (jobs/, issue 30) goes through the injected
clock (issue 14): a direct ``time.time``, ``time.monotonic``, ``time.perf_counter`` or ``time.sleep`` call outside
``ALLOWED`` fails here, so a new one fails CI. ``ALLOWED`` names each exception as ``path:function`` (the function's
qualified name); each such spot carries a one-line comment saying why it stays."""
from __future__ import annotations

import ast

from source_scan import flagged, stray_and_stale

NAMES = {"time", "monotonic", "sleep", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}

ALLOWED = {
    "gyre_hpc/clock.py:WallClock.__init__",  # the clock itself
    "gyre_hpc/clock.py:WallClock.now",
    "gyre_hpc/clock.py:WallClock.wall",
    "gyre_hpc/clock.py:WallClock.sleep",
    "gyre_hpc/clock.py:ManualClock.__init__",  # its default epoch stamp
}


def _calls_time(node: ast.AST, path: str) -> bool:
    """``node`` calls ``time.<NAMES>`` or imports one of them from ``time``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in NAMES:
        return isinstance(node.func.value, ast.Name) and node.func.value.id == "time"
    return isinstance(node, ast.ImportFrom) and node.module == "time" and any(a.name in NAMES for a in node.names)


def direct_time_calls(source: str, path: str) -> list[str]:
    """``path:qualname`` of each function that calls ``time.<NAMES>`` (or imports them from ``time``) in ``source``."""
    return flagged(source, path, _calls_time)


def test_gyre_hpc_and_the_jobs_read_time_only_through_the_clock_outside_the_allow_list():
    stray, _ = stray_and_stale(_calls_time, ALLOWED)
    assert not stray, "direct time.* calls bypass the injected clock (gyre_hpc/clock.py): " + ", ".join(stray)


def test_allow_list_names_only_functions_that_still_call_time():
    _, stale = stray_and_stale(_calls_time, ALLOWED)
    assert not stale, f"stale allow-list entries: {stale}"


def test_scanner_finds_calls_in_methods_nested_functions_and_from_imports():
    src = ("import time\nfrom time import sleep\n"
           "class A:\n    def f(self):\n        def g():\n            return time.perf_counter()\n        return g\n"
           "def h(clock):\n    return clock.now() + time.time()\n")
    assert direct_time_calls(src, "m.py") == ["m.py:<module>", "m.py:A.f.g", "m.py:h"]


def test_scanner_ignores_the_clock_and_other_time_attributes():
    src = "import time\ndef f(clock, loop):\n    time.strftime('%H')\n    return clock.sleep(1) or loop.time()\n"
    assert direct_time_calls(src, "m.py") == []


def test_manual_clock_wall_stamps_move_with_its_virtual_time():
    from gyre_hpc.clock import ManualClock

    clock = ManualClock(5.0, wall0=1000.0)
    assert clock.wall() == 1000.0
    clock.sleep(2.5)
    clock.advance(0.5)
    assert (clock.now(), clock.wall()) == (8.0, 1003.0)
