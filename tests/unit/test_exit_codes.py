"""The exit statuses of a run's outcomes (75 preempted, 69 rank lost, 70 error) are written as numbers only in
gyre_hpc/lifecycle/recovery.py: every other module of gyre_hpc/ and jobs/ names them (a scan of the source's
syntax trees, no import)."""
import ast
from pathlib import Path

from gyre_hpc.lifecycle import recovery

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "gyre_hpc" / "lifecycle" / "recovery.py"
CODES = {recovery.PREEMPTED_EXIT, recovery.RANK_LOST_EXIT, recovery.ERROR_EXIT}


def literals(path: Path) -> list[str]:
    """``path:line`` of every int literal in ``path`` equal to one of the outcome exit statuses."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and type(n.value) is int and n.value in CODES]


def test_no_exit_code_literal_outside_the_recovery_module():
    files = [p for d in ("gyre_hpc", "jobs") for p in sorted((ROOT / d).rglob("*.py")) if p != HOME]
    assert len(files) > 50  # the scan saw the packages
    assert [hit for p in files for hit in literals(p)] == []


def test_the_scan_finds_the_table_in_the_recovery_module():
    assert len(literals(HOME)) == 3
