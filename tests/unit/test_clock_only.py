"""Every wait and every time stamp in gyre_hpc goes through the injected clock (issue 14): a direct ``time.time``,
``time.monotonic``, ``time.perf_counter`` or ``time.sleep`` call outside ``ALLOWED`` fails here, so a new one
fails CI. ``ALLOWED`` names each exception as ``path:function`` (the function's qualified name); each such spot
carries a one-line comment saying why it stays."""
from __future__ import annotations

import ast
from pathlib import Path

import gyre_hpc

PACKAGE = Path(gyre_hpc.__file__).parent
NAMES = {"time", "monotonic", "sleep", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}

ALLOWED = {
    "gyre_hpc/clock.py:WallClock.__init__",  # the clock itself
    "gyre_hpc/clock.py:WallClock.now",
    "gyre_hpc/clock.py:WallClock.wall",
    "gyre_hpc/clock.py:WallClock.sleep",
    "gyre_hpc/clock.py:ManualClock.__init__",  # its default epoch stamp
}


def direct_time_calls(source: str, path: str) -> list[str]:
    """``path:qualname`` of each function that calls ``time.<NAMES>`` (or imports them from ``time``) in ``source``."""
    found: list[str] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope + [child.name] if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                               ast.ClassDef)) else scope
            where = f"{path}:{'.'.join(scope) or '<module>'}"
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr in NAMES
                    and isinstance(child.func.value, ast.Name) and child.func.value.id == "time"):
                found.append(where)
            if (isinstance(child, ast.ImportFrom) and child.module == "time"
                    and any(a.name in NAMES for a in child.names)):
                found.append(where)
            visit(child, inner)

    visit(ast.parse(source), [])
    return found


def test_gyre_hpc_reads_time_only_through_the_clock_outside_the_allow_list():
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = f"gyre_hpc/{path.relative_to(PACKAGE).as_posix()}"
        calls += direct_time_calls(path.read_text(), rel)
    stray = sorted(set(calls) - ALLOWED)
    assert not stray, "direct time.* calls bypass the injected clock (gyre_hpc/clock.py): " + ", ".join(stray)


def test_allow_list_names_only_functions_that_still_call_time():
    calls = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        calls |= set(direct_time_calls(path.read_text(), f"gyre_hpc/{path.relative_to(PACKAGE).as_posix()}"))
    assert ALLOWED <= calls, f"stale allow-list entries: {sorted(ALLOWED - calls)}"


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
