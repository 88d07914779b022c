"""The allocator server loop over the in-process transport, with scripted cells at the boundary (allocator_world)."""
import copy
import dataclasses
import threading
import time

import pytest

from allocator_world import ALLOC, SCHED, World
from gyre_hpc.allocator.eventlog import EventLog, read_events
from gyre_hpc.allocator.messages import CellFailed, Shutdown, SwitchDone, SwitchTo, Welcome
from gyre_hpc.allocator.types import Admit, Role, Switch
from gyre_hpc.clock import ManualClock, WallClock
from gyre_hpc.errors import CellLostError, ProtocolError


def switch_orders(w):
    return [(r["cell"], r["target"]) for r in w.events("order", order="switch")]


# ------------------------------------------------------------------------------------------------ policies
def test_gyre_moves_the_core_first_once_theta_b_ready_groups_stayed_for_tau_s(tmp_path):
    w = World(tmp_path).attach()
    w.server.run()
    theta_b = SCHED.theta * SCHED.batch_groups
    t_ready = min(r["t"] for r in w.events("groups_ready") if r["ready"] >= theta_b)
    first = w.events("order", order="switch")[0]
    assert (first["cell"], first["target"]) == (w.server.state.core, "train")
    assert first["t"] == pytest.approx(t_ready + SCHED.tau_s)  # the WakeAt is honoured to the tick
    assert w.events("order", order="wake", at=pytest.approx(t_ready + SCHED.tau_s))
    assert [o.role for o in w.orders_of(0, SwitchTo)] == [Role.TRAIN, Role.ROLLOUT, Role.TRAIN]
    assert w.orders_of(1, SwitchTo) == w.orders_of(2, SwitchTo) == []


def test_the_server_sends_exactly_what_the_policy_object_decided(tmp_path):
    w = World(tmp_path).attach()
    w.server.run()
    decided = [o for _, orders in w.policy.calls for o in orders]
    switches = [(o.cell, o.target.value) for o in decided if isinstance(o, Switch)]
    assert switches and switches == switch_orders(w)
    received = sorted((t, c.cell, o.role.value) for c in w.cells for t, o in c.orders if isinstance(o, SwitchTo))
    assert [(c, role) for _, c, role in received] == switches
    admits = [o.queries for o in decided if isinstance(o, Admit)]
    assert admits == [r["queries"] for r in w.events("order", order="admit")]


def test_colocate_switches_every_cell_with_a_full_batch_and_brings_them_all_back(tmp_path):
    w = World(tmp_path, "colocate").attach()
    w.server.run()
    orders = w.events("order", order="switch")
    # the run stops at its second step, before the second return
    assert [r["target"] for r in orders] == ["train"] * 3 + ["rollout"] * 3 + ["train"] * 3
    for burst in (orders[0:3], orders[6:9]):
        assert {r["cell"] for r in burst} == {0, 1, 2} and len({r["t"] for r in burst}) == 1
    ready_at_switch = [r["ready"] for r in w.events("groups_ready") if r["t"] <= orders[0]["t"]][-1]
    assert ready_at_switch >= SCHED.batch_groups
    steps = w.events("step")
    assert orders[3]["t"] == steps[0]["t"] and len(steps) == 2


def test_async_keeps_its_fixed_pools_from_the_first_welcome(tmp_path):
    w = World(tmp_path, "async").attach()
    summary = w.server.run()
    assert [w.orders_of(c, Welcome)[0].role for c in range(3)] == [Role.TRAIN, Role.TRAIN, Role.ROLLOUT]
    assert w.orders_of(0, Welcome)[0].mu is None and not w.orders_of(0, Welcome)[0].streaming
    assert switch_orders(w) == [] and summary["steps_done"] == 2
    assert w.events("start")[0]["roles"] == ["train", "train", "rollout"]


def test_switch_timing_breakdown_is_logged_with_the_observed_total(tmp_path):
    w = World(tmp_path, to_train_s=2.0).attach()
    w.server.run()
    done = w.events("switch_done")[0]
    order = w.events("order", order="switch", id=done["order"])[0]
    assert done["timing"] == {"drain_s": 0.5, "engine_stop_s": 0.25}
    assert done["total_s"] == pytest.approx(done["t"] - order["t"]) and done["total_s"] >= 2.0


def test_the_admit_callback_may_start_fewer_queries_than_admitted(tmp_path):
    w = World(tmp_path).attach()
    w.harness.queries = 5
    w.server.start()
    while not w.events("order", order="admit"):
        w.clock.sleep(0.01)
        w.server.step()
    assert w.events("order", order="admit")[0] | {"t": 0, "wall": 0} == {
        "event": "order", "order": "admit", "queries": 10, "started": 5, "t": 0, "wall": 0}
    assert w.server.state.admitted_queries == 5 and w.server.state.unfinished_runs == 5


def test_nothing_is_admitted_until_the_live_run_says_its_engines_serve(tmp_path):
    w = World(tmp_path).attach()
    serving = []
    w.server.ready = lambda: bool(serving)  # live: every rollout cell's engine registered with the proxy
    w.server.start()
    for _ in range(200):
        w.clock.sleep(0.01)
        w.server.step()
    assert len(w.events("hello")) == 3  # every cell said Hello: only the engines hold the start back
    assert not w.events("order", order="admit") and not w.events("started")
    serving.append(True)
    while not w.events("order", order="admit"):
        w.clock.sleep(0.01)
        w.server.step()
    (started,) = w.events("started")
    assert started["after_s"] >= 2.0 and w.events("order", order="admit")[0]["t"] >= started["t"]


def test_a_resume_starts_the_queries_in_flight_at_its_first_decision_even_with_half_a_batch_held(tmp_path):
    """Fixed batches of 4 and a window of one batch: 2 groups are held for their batch (in flight to the policy),
    2 queries of it were in flight at the preemption. The policy alone admits whole batches within the window, so
    it would never admit them (the run waited forever); the server starts them first (``readmit``)."""
    from gyre_hpc.lifecycle import resume

    sched = dataclasses.replace(SCHED, max_window_batches=1.0)
    w = World(tmp_path, "async", cells=3, sched=sched).attach()
    saved = {"version": 1, "steps_done": 1, "trained_batches": 1, "lag_sum": 0.0, "admitted_queries": 8}
    resume.restore_sched(w.server.state, saved, buffered=0, backlog_work_s=0.0, now=0.0, held=2)
    w.server.readmit = 2
    assert w.policy.decide(w.server.state, 0.0) == []  # the policy alone: the window is full
    w.server.start()
    for _ in range(1000):  # virtual time: the cells say Hello, the server starts and decides
        if w.events("order", order="admit"):
            break
        w.clock.sleep(0.01)
        w.server.step()
    assert w.events("order", order="admit")[0] | {"t": 0, "wall": 0} == {
        "event": "order", "order": "admit", "queries": 2, "started": 2, "resumed": True, "t": 0, "wall": 0}
    assert w.server.state.inflight_groups == 4 and w.server.readmit == 0


# ------------------------------------------------------------------------------------------------ failures
def test_a_silent_cell_becomes_lost_and_is_never_given_an_order(tmp_path):
    w = World(tmp_path, "colocate", run_s=10.0).attach()
    w.cells[2].silent_from = 0.5
    summary = w.server.run()
    (lost,) = w.events("lost")
    assert lost["cell"] == 2 and lost["reason"].startswith("heartbeat")
    assert lost["silent_s"] > ALLOC.heartbeat_timeout_s and lost["t"] < ALLOC.heartbeat_timeout_s + 0.5
    assert all(r["cell"] != 2 for r in w.events("order", order="switch"))
    assert {r["cell"] for r in w.events("order", order="switch")} == {0, 1}
    unread = []
    while (m := w.net.endpoint(3).poll()) is not None:
        unread.append(m[1])
    assert all(isinstance(m, Welcome) for m in unread)  # no SwitchTo, no Shutdown ever reached it
    assert w.orders_of(0, Shutdown) == w.orders_of(1, Shutdown) == [Shutdown(reason="2 optimizer steps done",
                                                                             lost=(2,))]
    assert summary == {"reason": "2 optimizer steps done", "steps_done": 2, "version": 2, "lost": [2], "no_bye": []}


def test_an_engine_killed_mid_run_loses_its_cell_but_none_of_its_runs(tmp_path):
    w = World(tmp_path)
    w.server.start()
    for _ in range(3):
        w.act(w.clock.now())
        w.server.step()
    st = w.server.state
    assert [c.runs for c in st.cells] == [4, 3, 3] and st.unfinished_runs == 10  # window B * (1 + 1.5 * 1)
    w.cells[1].link.send(CellFailed(cell=1, reason="engine exited with signal 9"))
    w.server.step()
    (lost,) = w.events("lost")
    assert (lost["cell"], lost["runs_rehomed"], lost["unfinished_runs"]) == (1, 3, 10)
    assert lost["reason"] == "failed: engine exited with signal 9"
    w.harness.act(w.clock.now())
    w.harness._snapshot()  # the proxy re-places the parked runs on the remaining engines
    w.server.step()
    assert [c.runs for c in st.cells] == [5, 0, 5] and st.parked_runs == 0 and st.unfinished_runs == 10
    assert w.events("runs")[-1]["runs"] == [5, 0, 5]
    st.check()


def test_a_cell_that_never_says_hello_is_lost_after_the_hello_timeout(tmp_path):
    w = World(tmp_path).attach()
    w.cells[2].silent_from = 0.0
    summary = w.server.run()
    (lost,) = w.events("lost")
    assert lost["cell"] == 2 and lost["reason"] == f"no Hello within {ALLOC.hello_timeout_s} s"
    assert lost["t"] == pytest.approx(ALLOC.hello_timeout_s, abs=0.3)
    assert min(r["t"] for r in w.events("order")) >= lost["t"]  # no decision before every cell is accounted for
    assert summary["steps_done"] == 2


def test_losing_the_core_shuts_the_other_cells_down_and_raises(tmp_path):
    w = World(tmp_path).attach()
    w.cells[0].silent_from = 16.0  # while it drains into training
    with pytest.raises(CellLostError, match="core cell 0 was lost after 0 steps"):
        w.server.run()
    assert w.events("stop")[0]["reason"] == "core cell 0 lost"
    assert [r["cell"] for r in w.events("bye")] == [1, 2]


def test_malformed_and_out_of_protocol_messages_are_logged_and_change_nothing(tmp_path):
    w = World(tmp_path).attach()
    w.server.start()
    for _ in range(2):  # hellos, then the first admission's placement snapshot
        w.clock.sleep(0.01)
        w.server.step()
    before = copy.deepcopy(w.server.state)
    w.net.queues[0].put((2, {"type": "Teleport"}))
    w.cells[1].link.send(SwitchDone(cell=1, role=Role.TRAIN, order=7))
    w.server.step()
    rejected = w.events("rejected")
    assert [(r["cell"], r["type"]) for r in rejected] == [(1, None), (1, "SwitchDone")]
    assert "'Teleport' is an unknown message type" in rejected[0]["error"]
    assert "pending is no switch" in rejected[1]["error"]
    assert w.server.state == before
    w2 = World(tmp_path / "again").attach()
    w2.net.queues[0].put((3, {"type": "Heartbeat", "cell": 2, "extra": 1}))
    assert w2.server.run()["steps_done"] == 2
    assert "Heartbeat.extra: unknown field" in w2.events("rejected")[0]["error"]


# ------------------------------------------------------------------------------------------------ shutdown
def test_shutdown_is_orderly_every_cell_says_bye_and_the_transport_is_closed(tmp_path):
    w = World(tmp_path).attach()
    summary = w.server.run()
    kinds = [r["event"] for r in w.events()]
    assert kinds[-5:] == ["shutdown", "bye", "bye", "bye", "stop"]
    assert summary["no_bye"] == [] and summary["reason"] == "2 optimizer steps done"
    assert all(len(w.orders_of(c, Shutdown)) == 1 and w.cells[c].link.closed for c in range(3))
    assert w.net.closed == [True] * 4
    with pytest.raises(Exception, match="already shut down"):
        w.server.shutdown("again")


def test_a_missing_bye_is_reported_after_the_shutdown_timeout(tmp_path):
    w = World(tmp_path).attach()
    w.cells[2].answers_shutdown = False
    summary = w.server.run()
    assert summary["no_bye"] == [2]
    t_shut, t_stop = w.events("shutdown")[0]["t"], w.events("stop")[0]["t"]
    assert t_stop - t_shut == pytest.approx(ALLOC.shutdown_timeout_s, abs=0.02)


def test_a_wall_clock_run_with_threaded_cells(tmp_path):
    sched = dataclasses.replace(SCHED, tau_s=0.05)
    alloc = dataclasses.replace(ALLOC, heartbeat_interval_s=0.02, heartbeat_timeout_s=2.0, poll_backoff_min_s=1e-4,
                                poll_backoff_max_s=2e-3, shutdown_timeout_s=2.0)
    w = World(tmp_path, sched=sched, alloc=alloc, clock=WallClock(), run_s=0.02, to_train_s=0.01,
              to_rollout_s=0.01, opt_s=0.01)
    w.harness.group_s = 0.002
    done = threading.Event()

    def cells():
        while not done.is_set():
            w.act(w.clock.now())
            w.clock.sleep(0.001)

    t = threading.Thread(target=cells)
    t.start()
    try:
        summary = w.server.run()
    finally:
        done.set()
        t.join()
    assert summary == {"reason": "2 optimizer steps done", "steps_done": 2, "version": 2, "lost": [], "no_bye": []}
    assert w.events("stop")[0]["t"] < 10.0


# ------------------------------------------------------------------------------------------------ event log
def test_event_records_are_on_disk_when_written_and_a_torn_last_line_is_skipped(tmp_path):
    clock = ManualClock(3.0)
    log = EventLog(tmp_path / "e.jsonl", clock)
    log.write({"event": "start", "cells": 2})
    (rec,) = read_events(tmp_path / "e.jsonl")  # readable before the log is closed
    assert (rec["t"], rec["event"], rec["cells"]) == (3.0, "start", 2) and abs(rec["wall"] - time.time()) < 60
    log.close()
    with open(tmp_path / "e.jsonl", "a") as f:
        f.write('{"t": 4.0, "event": "hel')
    assert [r["event"] for r in read_events(tmp_path / "e.jsonl")] == ["start"]
    (tmp_path / "bad.jsonl").write_text('{"event": "start"}\n[1, 2]\n')
    with pytest.raises(ProtocolError, match=r"bad.jsonl:2: an event record is a JSON object"):
        read_events(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text('{"event": "start"}\nnot json\n{"event": "stop"}\n')
    with pytest.raises(ProtocolError, match=r"bad2.jsonl:2: invalid JSON"):
        read_events(tmp_path / "bad2.jsonl")
