"""The proxy's outputs and settings: TITO buffer and flush, the append-only event log, the mover seam, ProxyConfig."""
import asyncio
import json
import os
import time

import pytest

from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError, ProtocolError
from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.proxy.events import proxy_log
from gyre_hpc.proxy.moveplan import MovePlan
from gyre_hpc.proxy.movers import ReprefillMover, make_mover
from gyre_hpc.proxy.recorder import TitoRecorder
from gyre_hpc.proxy.routing import ProxyError
from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, read_tito


def outcome(run, status=RunStatus.SCORED, score=0.5):
    return Outcome(run, run.split("-")[0], status, score)


# -------------------------------------------------------------------------------------------- recorder
def test_a_call_id_is_refused_while_in_flight_or_buffered_and_released_when_it_failed_or_was_flushed(tmp_path):
    rec = TitoRecorder()
    rec.reserve("q0-r0", "c0")
    with pytest.raises(ProxyError, match="already sent") as err:
        rec.reserve("q0-r0", "c0")
    assert err.value.status == 409
    rec.unreserve("q0-r0", "c0")  # the call failed
    rec.reserve("q0-r0", "c0")
    rec.add_call(Call.of("q0-r0", "c0", [1, 2], [3]))
    rec.flush(tmp_path / "t.jsonl")
    rec.reserve("q0-r0", "c0")


def test_flush_appends_selected_runs_and_keeps_the_others_buffered(tmp_path):
    rec = TitoRecorder()
    for run in ("q0-r0", "q0-r1", "q1-r0"):
        rec.add_call(Call.of(run, "c0", [1, 2], [3, 4]))
        rec.add_call(Call.of(run, "c1", [1, 2, 3, 4, 5], [6]))
    rec.add_outcome(outcome("q0-r0"))
    rec.add_outcome(outcome("q0-r1", RunStatus.EVAL_FAILURE, None))
    path = tmp_path / "step-0.jsonl"
    done = rec.flush(path, ["q0-r0", "q0-r1"])
    assert done == {"path": str(path), "calls": 4, "outcomes": 2, "runs": ["q0-r0", "q0-r1"], "recovered": [],
                    "served": {"q0-r0": {"calls": 2, "output_tokens": 3}, "q0-r1": {"calls": 2, "output_tokens": 3}}}
    log = read_tito(path)  # a complete, valid TITO file
    assert [(c.run_id, c.call_id) for c in log.calls] == [("q0-r0", "c0"), ("q0-r0", "c1"), ("q0-r1", "c0"),
                                                           ("q0-r1", "c1")]
    assert rec.pending() == {"calls": 2, "outcomes": 0}
    rec.add_outcome(outcome("q1-r0", score=1.0))
    assert rec.flush(path)["calls"] == 2
    assert len(read_tito(path).calls) == 6 and len(read_tito(path).outcomes) == 3  # appended, not replaced
    assert rec.pending() == {"calls": 0, "outcomes": 0}


def test_flush_refuses_a_torn_file_and_keeps_its_buffer(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"type":"call"')
    rec = TitoRecorder()
    rec.add_call(Call.of("q0-r0", "c0", [1], [2]))
    with pytest.raises(ProxyError, match="incomplete"):
        rec.flush(path)
    assert rec.pending()["calls"] == 1 and path.read_text() == '{"type":"call"'


def test_outcomes_need_a_score_exactly_when_their_status_has_one():
    rec = TitoRecorder()
    with pytest.raises(ProxyError, match="score null"):
        rec.add_outcome(outcome("q0-r0", RunStatus.EVAL_FAILURE, 0.0))
    with pytest.raises(ProxyError, match=r"a score in \[0, 1\]"):
        rec.add_outcome(outcome("q0-r0", RunStatus.SCORED, None))
    assert rec.add_outcome(outcome("q0-r0"))
    assert not rec.add_outcome(outcome("q0-r0"))  # the same outcome again (a retried post): accepted, no change
    with pytest.raises(ProxyError, match="already has a different outcome") as err:
        rec.add_outcome(outcome("q0-r0", score=1.0))
    assert err.value.status == 409 and rec.pending()["outcomes"] == 1


# ------------------------------------------------------------------------------------------- event log
def test_event_log_appends_whole_lines_and_never_rewrites(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"t":0,"source":"allocator","event":"start"}\n')
    log = proxy_log(path)
    log.write("move", rid="r/c", partial_tokens=3)
    log.write("engine_dead", engine="e0")
    log.close()
    events = read_events(path)
    assert [e["event"] for e in events] == ["start", "move", "engine_dead"]
    assert list(events[1]) == ["t", "source", "event", "rid", "partial_tokens"] and abs(events[1]["t"] - time.time()) < 60
    assert events[1]["source"] == "proxy" and (events[1]["rid"], events[1]["partial_tokens"]) == ("r/c", 3)
    assert [e["event"] for e in log.events] == ["move", "engine_dead"] and len(log.of("move")) == 1


def test_reading_events_skips_a_torn_last_line_but_not_a_bad_middle_one(tmp_path):
    path = tmp_path / "events.jsonl"
    good = json.dumps({"event": "move"})
    path.write_text(f"{good}\n{good}\n{{\"event\": \"mo")
    assert len(read_events(path)) == 2
    path.write_text(f"{good}\nnot json\n{good}\n")
    with pytest.raises(ProtocolError, match=r"events.jsonl:2: invalid JSON"):
        read_events(path)


def test_event_log_without_a_path_keeps_events_in_memory_only(tmp_path):
    log = proxy_log(None)
    log.write("engine_added", engine="e0")
    assert log.events[0]["event"] == "engine_added" and os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------------ mover
def test_reprefill_mover_recomputes_the_whole_prefix_and_moves_no_kv():
    plan = MovePlan("r/c", "e0", "http://a", True, "e1", "http://b", (1, 2, 3, 4, 5))
    cost = asyncio.run(ReprefillMover().prepare(plan))
    assert (cost.reprefill_tokens, cost.moved_tokens) == (5, 0)
    assert cost.reprefill_tokens + cost.moved_tokens == len(plan.tokens)
    assert make_mover("reprefill").name == "reprefill"
    with pytest.raises(ProxyError, match="proxy.mover"):
        make_mover("mooncake_kv")


# ----------------------------------------------------------------------------------------------- config
def test_proxy_config_defaults_and_dotted_errors():
    cfg = load_config(None).proxy
    assert (cfg.routing, cfg.mover, cfg.max_moves_per_call) == ("sticky_least_loaded", "kv", 8)
    assert cfg.kv_version_policy == "reprefill"
    with pytest.raises(ConfigError, match=r"proxy\.routing: 'random' is not one of"):
        load_config(None, ["proxy.routing=random"])
    with pytest.raises(ConfigError, match=r"proxy\.max_moves_per_call: must be >= 1, got 0"):
        load_config(None, ["proxy.max_moves_per_call=0"])
    with pytest.raises(ConfigError, match=r"proxy\.port: must be a TCP port"):
        load_config(None, ["proxy.port=70000"])
    with pytest.raises(ConfigError, match=r"proxy\.drain_timeout_s: must be > 0"):
        load_config(None, ["proxy.drain_timeout_s=0"])


# ------------------------------------------------------------------------- closed runs (issue 16)
def test_a_flush_that_carries_outcomes_writes_each_run_exactly_once_whether_or_not_it_was_posted(tmp_path):
    rec = TitoRecorder()
    for run in ("q0-r0", "q0-r1"):
        rec.add_call(Call.of(run, "c0", [1, 2], [3, 4]))
    rec.add_outcome(outcome("q0-r0"))  # posted; q0-r1's post was lost
    done = rec.flush(tmp_path / "q0.jsonl", ["q0-r0", "q0-r1"], [outcome("q0-r0"), outcome("q0-r1", score=1.0)])
    assert done["recovered"] == ["q0-r1"] and done["outcomes"] == 2
    log = read_tito(tmp_path / "q0.jsonl")
    assert sorted(o.run_id for o in log.outcomes) == ["q0-r0", "q0-r1"]
    assert rec.closed == {"q0-r0": str(tmp_path / "q0.jsonl"), "q0-r1": str(tmp_path / "q0.jsonl")}
    assert not rec.add_outcome(outcome("q0-r1", score=1.0))  # the lost post arrives late: no second record
    with pytest.raises(ProxyError, match="different outcome") as err:
        rec.add_outcome(outcome("q0-r1", score=0.0))
    assert err.value.status == 409 and rec.pending() == {"calls": 0, "outcomes": 0}


def test_a_late_call_of_a_closed_run_is_dropped_and_a_new_one_refused_so_no_file_gets_an_unfinished_run(tmp_path):
    rec = TitoRecorder()
    rec.reserve("q0-r0", "c0")
    rec.reserve("q0-r0", "c1")  # still in flight when the group is flushed
    rec.add_call(Call.of("q0-r0", "c0", [1, 2], [3]))
    rec.flush(tmp_path / "q0.jsonl", ["q0-r0"], [outcome("q0-r0")])
    assert rec.add_call(Call.of("q0-r0", "c1", [1, 2, 3], [4])) is False  # late: never buffered
    with pytest.raises(ProxyError, match="has ended") as err:
        rec.reserve("q0-r0", "c2")
    assert err.value.status == 409
    rec.add_call(Call.of("q1-r0", "c0", [1], [2]))
    rec.add_outcome(outcome("q1-r0"))
    rec.flush(tmp_path / "all.jsonl")  # a later flush of everything has no record of the closed run
    assert [c.run_id for c in read_tito(tmp_path / "all.jsonl").calls] == ["q1-r0"]
    assert len(read_tito(tmp_path / "q0.jsonl").calls) == 1


def test_a_refused_flush_writes_nothing_and_keeps_the_buffer(tmp_path):
    rec = TitoRecorder()
    rec.add_call(Call.of("q0-r0", "c0", [1, 2], [3]))
    rec.add_outcome(outcome("q0-r0"))
    path = tmp_path / "q0.jsonl"
    with pytest.raises(ProxyError, match="different buffered outcome") as err:
        rec.flush(path, ["q0-r0"], [outcome("q0-r0", score=0.0)])
    assert err.value.status == 409
    with pytest.raises(ProxyError, match="no outcome given for run 'q0-r1'"):
        rec.flush(path, ["q0-r0", "q0-r1"], [outcome("q0-r0")])
    with pytest.raises(ProxyError, match="must name its run_ids"):
        rec.flush(path, None, [outcome("q0-r0")])
    assert not path.exists() and rec.pending() == {"calls": 1, "outcomes": 1}
    rec.flush(path, ["q0-r0"], [outcome("q0-r0")])
    with pytest.raises(ProxyError, match="was flushed already") as err:
        rec.flush(tmp_path / "again.jsonl", ["q0-r0"], [outcome("q0-r0")])
    assert err.value.status == 409 and not (tmp_path / "again.jsonl").exists()


def test_served_counts_every_recorded_call_of_an_open_run_even_those_flushed_to_another_file(tmp_path):
    rec = TitoRecorder()
    rec.add_call(Call.of("q0-r0", "c0", [1, 2], [3, 4, 5]))
    rec.flush(tmp_path / "elsewhere.jsonl")  # e.g. an admin flush of everything: the call went there
    rec.add_call(Call.of("q0-r0", "c1", [1, 2, 3], [6]))
    done = rec.flush(tmp_path / "q0.jsonl", ["q0-r0"], [outcome("q0-r0")])
    assert done["served"] == {"q0-r0": {"calls": 2, "output_tokens": 4}}  # the group file has 1 call, 1 token
    assert len(read_tito(tmp_path / "q0.jsonl").calls) == 1
