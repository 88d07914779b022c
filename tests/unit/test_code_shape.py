"""The shape the house keeps (issue 30, "How we will know"): no function longer than 80 lines in gyre_hpc/ or jobs/,
and no import cycle between modules of gyre_hpc and jobs (any import, lazy or under TYPE_CHECKING: two modules that
need each other's names share a third module, as ``proxy.moveplan`` and ``agents.result`` do). Read from the source
with ``ast`` and grimp (import-linter's graph), so nothing is imported or run."""
from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80


def long_functions(source: str, path: str) -> list[str]:
    """``path:name lines`` of each function in ``source`` over ``MAX_LINES`` lines (decorators not counted)."""
    return [f"{path}:{n.name} {n.end_lineno - n.lineno + 1}" for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_LINES]


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return groups


def test_the_checks_find_a_long_function_and_a_cycle():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    assert long_functions(f"def f():\n{body}\n", "m.py") == [f"m.py:f {MAX_LINES + 1}"]
    assert long_functions("def g():\n    return 1\n", "m.py") == []
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_function_in_gyre_hpc_or_jobs_is_over_80_lines():
    found = [f for top in ("gyre_hpc", "jobs") for p in sorted((ROOT / top).rglob("*.py"))
             for f in long_functions(p.read_text(), p.relative_to(ROOT).as_posix())]
    assert found == []


def test_no_two_modules_of_gyre_hpc_or_jobs_import_each_other_in_a_cycle():
    graph = grimp.build_graph("gyre_hpc", "jobs")
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert import_cycles(edges) == []
