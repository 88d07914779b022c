"""One name, one thing: no class name is defined in two modules of gyre_hpc (issue 30)."""
import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gyre_hpc"


def test_no_class_name_is_defined_in_two_modules():
    homes: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                homes[node.name].add(str(path.relative_to(PACKAGE.parent)))
    assert {name: sorted(paths) for name, paths in homes.items() if len(paths) > 1} == {}
