"""The architecture tests' one source scanner: ``path:qualname`` of each place in gyre_hpc and jobs/ a rule flags.

``flagged(source, path, rule)`` walks the syntax tree of ``source``; every node for which ``rule(node, path)`` is
true is reported as ``path:qualname`` (the enclosing function or class, ``<module>`` at top level)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

import gyre_hpc

PACKAGE = Path(gyre_hpc.__file__).parent
ROOTS = (PACKAGE, PACKAGE.parent / "jobs")  # the library and the entry points

Rule = Callable[[ast.AST, str], bool]


def flagged(source: str, path: str, rule: Rule) -> list[str]:
    """``path:qualname`` of each node of ``source`` that ``rule`` flags, in source order."""
    found: list[str] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope + [child.name] if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                               ast.ClassDef)) else scope
            if rule(child, path):
                found.append(f"{path}:{'.'.join(scope) or '<module>'}")
            visit(child, inner)

    visit(ast.parse(source), [])
    return found


def flagged_in_tree(rule: Rule) -> list[str]:
    """``flagged`` over every module of gyre_hpc and jobs/ (paths ``gyre_hpc/...``, ``jobs/...``)."""
    assert all(root.is_dir() for root in ROOTS) and (ROOTS[1] / "train.py").is_file(), ROOTS
    out: list[str] = []
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            out += flagged(path.read_text(), f"{root.name}/{path.relative_to(root).as_posix()}", rule)
    return out


def stray_and_stale(rule: Rule, allowed: set[str]) -> tuple[list[str], list[str]]:
    """(places ``rule`` flags outside ``allowed``, entries of ``allowed`` it no longer flags), both sorted."""
    found = set(flagged_in_tree(rule))
    return sorted(found - allowed), sorted(allowed - found)
