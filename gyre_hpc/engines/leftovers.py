"""Engine processes left behind by a live run that ended abnormally (edge: Linux ``/proc``).

An engine is started in its own process group with a parent-death signal (``children.spawn``), and SGLang's
scheduler and detokenizer set their own. One case escapes both: when the rank that started an SGLang server is
killed while the server is still starting (another rank failed and MPI_Abort ended the world), the server dies
but its ``sglang::detokenizer`` child can stay, orphaned, holding its memory (seen twice, Dec 2026).

``kill_left_behind(run_dir)`` finds them by what only they have: a standard output that is an engine log of that
run (``RUN_DIR/cells/cell<c>/engine-<n>.log``, where ``children.spawn`` points every engine process and all it
starts), and SIGKILLs each by PID.

Invariants
- Only processes whose fd 1 is a file ``engine-*.log`` under this run directory's ``cells/`` are signalled; the
  ranks, the launcher and every other process have another standard output.
- A process that ends between the scan and the signal is skipped; nothing here raises for a vanished process.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path


def left_behind(run_dir: str | Path) -> list[int]:
    """PIDs of live processes whose standard output is an engine log of ``run_dir``."""
    cells = str(Path(run_dir).resolve() / "cells") + os.sep
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            target = os.readlink(entry / "fd" / "1")
        except OSError:
            continue
        target = target.removesuffix(" (deleted)")
        if target.startswith(cells) and Path(target).name.startswith("engine-") and target.endswith(".log"):
            found.append(int(entry.name))
    return sorted(found)


def kill_left_behind(run_dir: str | Path) -> list[int]:
    """SIGKILL every process ``left_behind`` finds; returns their PIDs."""
    killed = []
    for pid in left_behind(run_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(pid)
    return killed
