"""Events reach a run's event log only through the one writer, ``gyre_hpc.allocator.eventlog.EventLog`` (issue 30):
in gyre_hpc and in its entry points (jobs/), a file opened for appending (``open(p, "a")``, ``Path.open("a")``,
``os.open`` with ``O_APPEND``) outside ``ALLOWED`` fails here, and so does a record built by hand with the event log's
head (a dict literal with both ``"t"`` and ``"event"``). ``ALLOWED`` names each append-only file that is no event
log as ``path:function``, with a one-line comment saying what it appends."""
from __future__ import annotations

import ast

from source_scan import flagged, stray_and_stale

WRITER = "gyre_hpc/allocator/eventlog.py"

ALLOWED = {
    "gyre_hpc/allocator/eventlog.py:EventLog.__init__",  # the event log itself
    "gyre_hpc/engines/launch.py:spawn_ready",  # an engine process's stdout and stderr (engineN.log)
    "gyre_hpc/live/launch.py:launch",  # mpirun's output (mpirun.log)
    "gyre_hpc/live/rank.py:_traceback_on_signal",  # faulthandler's stack dumps (traces/rankN.txt)
    "gyre_hpc/live/root.py:RootRun.on_step",  # the step records (metrics.jsonl)
    "gyre_hpc/live/rollouts.py:Rollouts._record",  # one line per finished group (groups.jsonl)
    "jobs/train.py:_sync.on_step",  # the synchronous loop's step records (metrics.jsonl)
}


def _appends(call: ast.Call) -> bool:
    """``call`` opens a file for appending."""
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "open" and isinstance(f.value, ast.Name) and f.value.id == "os":
        return any("O_APPEND" in ast.unparse(a) for a in call.args[1:2] + [k.value for k in call.keywords])
    is_open = (isinstance(f, ast.Name) and f.id == "open") or (isinstance(f, ast.Attribute) and f.attr == "open")
    if not is_open:
        return False
    pos = 1 if isinstance(f, ast.Name) or (isinstance(f.value, ast.Name) and f.value.id == "io") else 0
    modes = [k.value for k in call.keywords if k.arg == "mode"] + call.args[pos:pos + 1]
    return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and "a" in m.value for m in modes)


def _event_record(node: ast.Dict) -> bool:
    keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
    return {"t", "event"} <= keys


def _writes_events(node: ast.AST, path: str) -> bool:
    if isinstance(node, ast.Call):
        return _appends(node)
    return isinstance(node, ast.Dict) and path != WRITER and _event_record(node)


def event_writes(source: str, path: str) -> list[str]:
    """``path:qualname`` of each function that opens a file for appending or builds an event record by hand."""
    return flagged(source, path, _writes_events)


def test_gyre_hpc_and_the_jobs_append_events_only_through_the_event_log():
    stray, _ = stray_and_stale(_writes_events, ALLOWED)
    assert not stray, ("files appended to, or event records written, outside gyre_hpc.allocator.eventlog.EventLog: "
                       + ", ".join(stray))


def test_allow_list_names_only_functions_that_still_append():
    assert stray_and_stale(_writes_events, ALLOWED)[1] == [], "stale allow-list entries"


def test_scanner_finds_appends_of_every_form_and_hand_made_records():
    src = ("import os\nfrom pathlib import Path\n"
           "def a(p):\n    with open(p, 'a', encoding='utf-8') as f:\n        pass\n"
           "def b(p):\n    return Path(p).open(mode='ab')\n"
           "class C:\n    def c(self, p):\n        return os.open(p, os.O_WRONLY | os.O_APPEND)\n"
           "def d(f, t):\n    f.write(str({'t': t, 'wall': 0, 'event': 'error'}))\n")
    assert event_writes(src, "m.py") == ["m.py:a", "m.py:b", "m.py:C.c", "m.py:d"]


def test_scanner_ignores_reads_writes_and_event_fields_without_the_head():
    src = ("import os\n"
           "def f(p, log):\n    open(p).read()\n    open(p, 'w').write('x')\n    os.open(p, os.O_RDONLY)\n"
           "    log.write({'event': 'stop', 'reason': 'done'})\n    return p.open('rb')\n")
    assert event_writes(src, "m.py") == []
