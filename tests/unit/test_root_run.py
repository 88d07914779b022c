"""gyre_hpc.live.root: rank 0's run in phases (start the proxy, wire, run, finish), each phase's failure path, and the
one Outcome it returns. Doubles only at the true boundaries: the proxy subprocess (a starter that records or
raises), the data-plane communicator (a recorder of broadcasts), and the control world, an in-process transport
with no cell behind it (the live runs: tests/integration/test_live_training.py, test_preempt_edges.py)."""
import json

import pytest

from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.allocator.transport import InProcessWorld
from gyre_hpc.clock import WallClock
from gyre_hpc.config import load_config
from gyre_hpc.errors import GyreError
from gyre_hpc.lifecycle import resume
from gyre_hpc.lifecycle.recovery import OutcomeKind, StopKind
from gyre_hpc.live import lost
from gyre_hpc.live.root import RootRun, drive

CELLS = 2
DEAD_URL = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once


class ProxyDouble:
    """What ``launch_proxy`` returns: the proxy's URL, and ``stop``."""

    def __init__(self):
        self.url, self.stopped = DEAD_URL, 0

    def stop(self):
        self.stopped += 1


class ProxyStarterDouble:
    """The proxy subprocess's starter: returns ``ProxyDouble``s, or raises ``fails``."""

    def __init__(self, fails: BaseException | None = None):
        self.fails, self.started = fails, []

    def __call__(self, pcfg, **kwargs):
        if self.fails is not None:
            raise self.fails
        self.started.append(ProxyDouble())
        return self.started[-1]


class CommDouble:
    """The data-plane communicator as rank 0's phases use it: ``bcast`` of the proxy's URL."""

    def __init__(self):
        self.sent = []

    def bcast(self, obj, root=0):
        self.sent.append(obj)
        return obj


class FailingTransportDouble:
    """The control world whose receive fails as a broken MPI link would."""

    def __init__(self, transport):
        self._inner = transport

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def poll(self):
        raise OSError("control world: connection reset by peer")


def make_root(tmp_path, starter=None, transport=None, **kw) -> RootRun:
    cfg = load_config(None, ["tracking.backends=[]", f"cluster.cells={CELLS}", "allocator.steps=2"])
    transport = transport or InProcessWorld(1 + CELLS).endpoint(0, WallClock())
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return RootRun(cfg, run_dir, transport, CommDouble(), proxy_starter=starter or ProxyStarterDouble(), **kw)


def events(root: RootRun) -> list[dict]:
    return read_events(root.run_dir / root.cfg.allocator.events_file)


@pytest.fixture
def roots():
    made: list[RootRun] = []
    yield made
    for root in made:  # the harness thread of a wired run that never reached its shutdown
        if root.rollouts is not None and root.rollouts.thread.is_alive():
            root.rollouts.stop()


def test_a_proxy_that_cannot_start_is_one_error_event_and_no_url_goes_to_the_cells(tmp_path):
    root = make_root(tmp_path, ProxyStarterDouble(fails=GyreError("proxy: port taken three times")))
    with pytest.raises(GyreError, match="port taken"):
        drive(root)
    assert root.comm.sent == [] and root.proxy is None and root.hub is None
    assert [(e["event"], e["error"], e["resume"]) for e in events(root)] == \
        [("error", "GyreError: proxy: port taken three times", None)]


def test_a_resume_state_that_cannot_be_rebuilt_fails_the_wiring_stops_the_proxy_and_keeps_the_state(tmp_path, roots):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    resume.save_empty(run_dir)
    state_file = resume.resume_dir(run_dir) / resume.STATE
    state = json.loads(state_file.read_text())
    state["buffer"] = [{"gid": 0, "tito": str(run_dir / "tito" / "gone.jsonl"), "runs": 2, "trained_tokens": 7,
                        "gen_versions": [0]}]  # its TITO file vanished after the pre-check
    state_file.write_text(json.dumps(state))
    starter = ProxyStarterDouble()
    root = make_root(tmp_path, starter)
    roots.append(root)
    with pytest.raises(GyreError):
        drive(root)
    assert starter.started[0].stopped == 1 and root.comm.sent == [DEAD_URL]
    assert [e["event"] for e in events(root)] == ["error"] and events(root)[0]["resume"] is None
    assert json.loads(state_file.read_text()) == state  # never started: the state it was to resume stays


def test_a_broken_control_world_while_running_is_an_error_event_and_the_proxy_stops(tmp_path, roots):
    starter = ProxyStarterDouble()
    inner = InProcessWorld(1 + CELLS).endpoint(0, WallClock())
    root = make_root(tmp_path, starter, transport=FailingTransportDouble(inner))
    roots.append(root)
    with pytest.raises(GyreError):  # the shutdown's proxy stats fail next (the proxy double serves nothing)
        drive(root)
    assert root.server is not None and not root.server.started
    assert starter.started[0].stopped == 1
    assert events(root)[-1]["event"] == "error" and events(root)[-1]["resume"] is None
    assert not resume.exists(root.run_dir)  # nothing started: nothing new to save


def test_a_teardown_stops_the_run_with_the_rank_lost_outcome_and_its_resume_state(tmp_path):
    teardown = lost.Teardown()
    teardown.signal = "SIGTERM"  # mpirun's, as the handler notes it
    root = make_root(tmp_path, teardown=teardown)
    out = drive(root)
    assert out.kind is OutcomeKind.RANK_LOST and out.exit == 69
    assert out.reason.kind is StopKind.RANK_LOST and out.reason.detail.startswith("SIGTERM from mpirun")
    assert out.resume == str(resume.resume_dir(root.run_dir)) and out.error is None and out.summary is None
    assert resume.load(root.run_dir)["version"] == 0
    assert "lost_rank_saved" in [e["event"] for e in events(root)]
    assert not (root.run_dir / "summary.json").exists()


def test_a_finish_that_fails_writes_no_summary_and_leaves_the_resume_state(tmp_path, roots):
    root = make_root(tmp_path)
    roots.append(root)
    root.start_proxy()
    root.wire()
    resume.save_empty(root.run_dir)
    (root.run_dir / "cells").mkdir()
    (root.run_dir / "cells" / "cell0.json").write_text("{cut")  # a cell's stats written half
    with pytest.raises(json.JSONDecodeError):
        root.finish({"reason": "2 optimizer steps done", "steps_done": 2, "version": 2, "lost": [], "no_bye": []})
    assert not (root.run_dir / "summary.json").exists() and resume.exists(root.run_dir)


def test_the_callbacks_before_the_wiring_are_a_clear_error_and_the_harness_reports_are_dropped(tmp_path):
    root = make_root(tmp_path)
    with pytest.raises(GyreError, match="before wire"):
        root.role_of(0)
    root.post(object())  # the harness's monitor may report before the server exists: nobody reads it yet
