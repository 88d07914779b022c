"""The live executor and the shared state transitions: facts in, the policy's own decisions out."""
import copy

import pytest

from allocator_world import SCHED
from gyre_hpc.allocator import transitions as tr
from gyre_hpc.allocator.executor import LiveExecutor
from gyre_hpc.allocator.messages import (Bye, CellFailed, EngineDied, EngineRestarted, GroupsReady, Heartbeat, Hello,
                                         RunsChanged, SwitchDone, SwitchTo, TrainProgress)
from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.state import CellState, SchedState
from gyre_hpc.allocator.types import Role, Switch
from gyre_hpc.errors import ProtocolError, SchedulingError


def executor(policy="gyre", cells=3):
    ex = LiveExecutor(make_policy(policy, SCHED, cells), cells, runs_per_query=2)
    for c in range(cells):
        ex.apply(Hello(cell=c, rank=c + 1), 0.0, source=c)
    return ex


def state(*roles):
    return SchedState(cells=[CellState(role=r) for r in roles])


# ---------------------------------------------------------------------------------------------- transitions
def test_switches_begin_only_from_rollout_to_train_and_back():
    st = state(Role.ROLLOUT, Role.TRAIN, Role.LOST)
    assert tr.begin_switch(st, Switch(0, Role.TRAIN), 1.0) is Role.DRAINING
    assert tr.begin_switch(st, Switch(1, Role.ROLLOUT), 1.0) is Role.LOADING
    for cell, target in [(0, Role.ROLLOUT), (2, Role.TRAIN), (2, Role.ROLLOUT)]:
        with pytest.raises(SchedulingError, match=f"cannot switch cell {cell}"):
            tr.begin_switch(st, Switch(cell, target), 2.0)
    with pytest.raises(SchedulingError, match="there are 3 cells"):
        tr.begin_switch(st, Switch(3, Role.TRAIN), 2.0)


def test_switches_finish_only_from_a_transition():
    st = state(Role.DRAINING, Role.LOADING, Role.TRAIN)
    assert tr.finish_switch(st, 0, 3.0) is Role.TRAIN and st.cells[0].since == 3.0
    assert tr.finish_switch(st, 1, 3.0) is Role.ROLLOUT
    with pytest.raises(SchedulingError, match="not in a transition"):
        tr.finish_switch(st, 2, 3.0)


def test_a_step_advances_version_once_consumes_a_batch_and_feeds_the_window():
    st = state(Role.TRAIN)
    tr.admit(st, 6, 6)
    tr.groups_ready(st, 6, 60.0, now=1.0)
    tr.groups_trained(st, 4, 40.0)
    st.optimizing = True
    tr.step_done(st, batch_groups=4, mean_lag=0.5, now=2.0)
    assert (st.version, st.steps_done, st.burst_steps, st.optimizing) == (1, 1, 1, False)
    assert (st.ready_groups, st.unprocessed_groups, st.backlog_work_s) == (2, 2, 20.0)
    assert (st.trained_batches, st.lag_sum) == (1, 0.5)
    assert st.ready_since(3) is None and st.ready_since(2) is not None
    with pytest.raises(SchedulingError, match="needs 4 ready groups, 2 are"):
        tr.step_done(st, 4, 0.0, 3.0)


def test_counts_cannot_go_negative():
    st = state(Role.ROLLOUT)
    tr.admit(st, 1, 1)
    with pytest.raises(SchedulingError, match="2 groups became ready but only 1"):
        tr.groups_ready(st, 2, 0.0, 0.0)
    with pytest.raises(SchedulingError, match="1 groups trained but only 0"):
        tr.groups_trained(st, 1, 0.0)


def test_losing_a_cell_parks_its_runs_and_loses_none():
    st = state(Role.ROLLOUT, Role.ROLLOUT)
    tr.admit(st, 4, 7)
    st.cells[0].runs, st.cells[1].runs, st.parked_runs = 4, 3, 0
    assert tr.lose_cell(st, 1, 5.0) == 3
    assert st.cells[1].role is Role.LOST and st.cells[1].runs == 0
    assert (st.unfinished_runs, st.parked_runs) == (7, 3)
    st.check()


# ---------------------------------------------------------------------------------------------- executor
def test_decisions_are_exactly_the_policy_decisions_on_the_same_state():
    ex = executor()
    ex.admitted(ex.decide(0.0).admit)
    ex.apply(GroupsReady(groups=4, work_s=8.0), 1.0)
    twin = copy.deepcopy(ex.state)
    expected = ex.policy.decide(twin, 11.0)
    got = ex.decide(11.0)
    assert expected == [Switch(0, Role.TRAIN)]
    assert got.switches == [SwitchTo(cell=0, role=Role.TRAIN, order=1)]
    assert ex.state.cells[0].role is Role.DRAINING and ex.pending[0][:2] == (1, Role.TRAIN)


def test_a_time_condition_becomes_one_wake_up_remembered_once():
    ex = executor()
    ex.admitted(ex.decide(0.0).admit)
    ex.apply(GroupsReady(groups=2, work_s=0.0), 1.0)
    assert ex.decide(2.0).wakes == [11.0]
    assert ex.decide(3.0).wakes == []  # already pending
    assert not ex.wake_due(10.9) and ex.wake_due(11.0) and ex.next_wake is None


def test_admission_counts_runs_as_parked_until_the_proxy_places_them():
    ex = executor()
    d = ex.decide(0.0)
    assert d.admit == 10  # window B * (1 + 1.5 * target) = 4 * 2.5 (streaming prior)
    ex.admitted(5)
    st = ex.state
    assert (st.admitted_queries, st.inflight_groups, st.unfinished_runs, st.parked_runs) == (5, 5, 10, 10)
    ex.apply(RunsChanged(runs=(4, 3, 1), ended=1), 1.0)
    assert (st.unfinished_runs, st.parked_runs, [c.runs for c in st.cells]) == (9, 1, [4, 3, 1])
    st.check()


def test_runs_snapshots_are_checked_before_they_change_anything():
    ex = executor()
    ex.admitted(2)  # 4 runs
    ex.apply(RunsChanged(runs=(1, 1, 1), ended=1), 1.0)
    before = copy.deepcopy(ex.state)
    for bad, match in [(RunsChanged(runs=(1, 1), ended=1), "2 counts for 3 cells"),
                       (RunsChanged(runs=(1, 1, 1), ended=0), "1 had already ended"),
                       (RunsChanged(runs=(0, 0, 0), ended=5), "4 were started"),
                       (RunsChanged(runs=(2, 1, 1), ended=1), "4 runs on cells exceed 3 unfinished")]:
        with pytest.raises(ProtocolError, match=match):
            ex.apply(bad, 2.0)
        assert ex.state == before


def test_switch_done_must_answer_the_pending_order():
    ex = executor()
    ex.admitted(ex.decide(0.0).admit)
    ex.apply(GroupsReady(groups=4, work_s=0.0), 1.0)
    ex.decide(11.0)
    with pytest.raises(ProtocolError, match="cell 1 reports order 1 to train; pending is no switch"):
        ex.apply(SwitchDone(cell=1, role=Role.TRAIN, order=1), 12.0, source=1)
    with pytest.raises(ProtocolError, match="pending is order 1 to train"):
        ex.apply(SwitchDone(cell=0, role=Role.TRAIN, order=2), 12.0, source=0)
    rec = ex.apply(SwitchDone(cell=0, role=Role.TRAIN, order=1, timing={"drain_s": 1.0}), 13.5, source=0)
    assert rec == {"event": "switch_done", "cell": 0, "role": "train", "order": 1, "timing": {"drain_s": 1.0},
                   "total_s": 2.5}
    assert ex.state.cells[0].role is Role.TRAIN


def test_a_cell_speaks_only_for_itself_and_only_after_hello():
    ex = LiveExecutor(make_policy("gyre", SCHED, 3), 3, runs_per_query=1)
    with pytest.raises(ProtocolError, match="has not said Hello"):
        ex.apply(Heartbeat(cell=0), 0.0, source=0)
    with pytest.raises(ProtocolError, match="Hello.cell: 1, but it came from cell 0's rank"):
        ex.apply(Hello(cell=1, rank=1), 0.0, source=0)
    with pytest.raises(ProtocolError, match="Hello.cell: 5 is not a cell"):
        ex.apply(Hello(cell=5, rank=6), 0.0, source=None)
    ex.apply(Hello(cell=0, rank=1), 0.0, source=0)
    with pytest.raises(ProtocolError, match="already said Hello"):
        ex.apply(Hello(cell=0, rank=1), 0.0, source=0)
    assert ex.apply(Heartbeat(cell=0), 4.0, source=0) is None and ex.last_seen[0] == 4.0


def test_only_the_core_steps_and_one_version_at_a_time():
    ex = LiveExecutor(make_policy("async", SCHED, 3), 3, runs_per_query=1)  # cells 0 (core) and 1 train
    for c in range(3):
        ex.apply(Hello(cell=c, rank=c + 1), 0.0, source=c)
    ex.admitted(ex.decide(0.0).admit)
    ex.apply(GroupsReady(groups=6, work_s=6.0), 1.0)
    with pytest.raises(ProtocolError, match="cell 1 is a satellite; only core cell 0 steps"):
        ex.apply(TrainProgress(cell=1, version=1, groups=4), 2.0, source=1)
    with pytest.raises(ProtocolError, match="cell 2 is rollout, not training"):
        ex.apply(TrainProgress(cell=2, version=0, groups=1), 2.0, source=2)
    with pytest.raises(ProtocolError, match="version: 2 after 0; one step at a time"):
        ex.apply(TrainProgress(cell=0, version=2, groups=4), 2.0, source=0)
    with pytest.raises(ProtocolError, match="7 groups trained"):
        ex.apply(TrainProgress(cell=0, version=0, groups=7), 2.0, source=0)
    ex.apply(TrainProgress(cell=1, version=0, groups=2, work_s=2.0), 2.0, source=1)
    ex.apply(TrainProgress(cell=0, version=0, groups=2, work_s=2.0, optimizing=True), 3.0, source=0)
    assert ex.state.optimizing
    rec = ex.apply(TrainProgress(cell=0, version=1, mean_lag=0.25), 4.0, source=0)
    assert rec["event"] == "step" and rec["steps_done"] == 1
    st = ex.state
    assert (st.version, st.optimizing, st.ready_groups, st.unprocessed_groups, st.lag_sum) == (1, False, 2, 2, 0.25)


def test_a_failed_cell_is_lost_its_runs_rehomed_and_its_messages_ignored():
    ex = executor()
    ex.admitted(4)  # 8 runs
    ex.apply(RunsChanged(runs=(3, 3, 2), ended=0), 1.0)
    rec = ex.apply(CellFailed(cell=1, reason="engine killed"), 2.0, source=1)
    assert rec["event"] == "lost" and rec["reason"] == "failed: engine killed"
    assert (rec["runs_rehomed"], rec["unfinished_runs"]) == (3, 8)
    assert ex.state.parked_runs == 3 and ex.lost == [1]
    with pytest.raises(ProtocolError, match="cell 1 is lost"):
        ex.apply(Heartbeat(cell=1), 3.0, source=1)
    ex.apply(RunsChanged(runs=(4, 1, 3), ended=0), 3.0)  # a stale snapshot still shows runs on cell 1
    assert [c.runs for c in ex.state.cells] == [4, 0, 3] and ex.state.parked_runs == 1
    ex.state.check()


def test_an_engine_death_and_restart_are_logged_and_change_no_state():
    ex = executor("async")  # cells 0 and 1 train, cell 2 rolls out
    ex.admitted(2)
    ex.apply(RunsChanged(runs=(0, 0, 4), ended=0), 1.0)
    before = copy.deepcopy(ex.state)
    died = ex.apply(EngineDied(cell=2, pid=77, exit_code=-9, engine="cell2-e1", calls_moved=3, runs_moved=3), 2.0,
                    source=2)
    assert died == {"event": "engine_died", "cell": 2, "pid": 77, "exit_code": -9, "engine": "cell2-e1",
                    "calls_moved": 3, "runs_moved": 3, "calls_lost": 0}
    back = ex.apply(EngineRestarted(cell=2, pid=78, start_s=4.5, version=0, engine="cell2-e2"), 7.0, source=2)
    assert back["event"] == "engine_restarted" and (back["pid"], back["start_s"], back["restarts"]) == (78, 4.5, 1)
    assert ex.state == before and ex.last_seen[2] == 7.0
    with pytest.raises(ProtocolError, match="EngineDied: cell 1 is train; only a rolling-out cell has an engine"):
        ex.apply(EngineDied(cell=1, pid=5, exit_code=1), 8.0, source=1)


def test_silent_cells_are_found_and_a_bye_before_shutdown_is_a_loss():
    ex = executor()
    ex.apply(Heartbeat(cell=0), 4.0, source=0)
    assert ex.silent(5.5, timeout=5.0) == [1, 2]
    assert ex.apply(Bye(cell=2), 6.0, source=2)["reason"].startswith("left")
    assert ex.silent(9.5, timeout=5.0) == [0, 1]


def test_no_order_is_produced_for_a_lost_cell():
    for name in ("gyre", "colocate", "async"):
        ex = executor(name)
        ex.lose(2, 0.0, "test")
        ex.admitted(ex.decide(0.0).admit)
        ex.apply(GroupsReady(groups=ex.state.inflight_groups, work_s=1.0), 1.0)
        for now in (1.0, 20.0, 40.0):
            assert all(s.cell != 2 for s in ex.decide(now).switches)
