"""Allocator messages: plain-data round trips, and every malformed message is a ProtocolError naming the field."""
import dataclasses
import json
import pickle

import pytest

from gyre_hpc.allocator.messages import (EVENTS, ORDERS, Bye, CellFailed, EngineDied, EngineRestarted, GroupsReady,
                                         Heartbeat, Hello, RunsChanged, Shutdown, SwitchDone, SwitchTo, TrainProgress,
                                         Welcome, decode)
from gyre_hpc.allocator.types import Role
from gyre_hpc.errors import GyreError, ProtocolError

EVENT_EXAMPLES = [
    Hello(cell=2, rank=3, node="n3", pid=1234),
    Heartbeat(cell=0, seq=7),
    SwitchDone(cell=1, role=Role.TRAIN, order=4,
               timing={"drain_s": 1.5, "engine_stop_s": 0.25, "weight_pull_s": 3.0, "engine_start_s": 0}),
    RunsChanged(runs=(3, 0, 5), ended=11),
    GroupsReady(groups=2, work_s=12.5),
    TrainProgress(cell=0, version=3, groups=1, work_s=4.0, optimizing=True, mean_lag=0.75),
    EngineDied(cell=1, pid=4321, exit_code=-9, engine="cell1-e1", calls_moved=3, runs_moved=2),
    EngineRestarted(cell=1, pid=4400, start_s=6.5, version=2, engine="cell1-e2", restarts=1),
    CellFailed(cell=2, reason="engine exited with status -9"),
    Bye(cell=1),
]
ORDER_EXAMPLES = [
    Welcome(cell=1, role=Role.TRAIN, core=0, streaming=True, mu=2),
    Welcome(cell=2, role=Role.ROLLOUT, core=0, streaming=False, mu=None),
    SwitchTo(cell=0, role=Role.ROLLOUT, order=9),
    Shutdown(reason="10 optimizer steps done"),
    Shutdown(reason="core cell 0 lost", lost=(0, 2)),
]


@pytest.mark.parametrize("msg", EVENT_EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_event_survives_dict_json_and_pickle_round_trips(msg):
    data = msg.to_dict()
    assert data["type"] == type(msg).__name__
    assert decode(data, EVENTS) == msg
    assert decode(json.loads(json.dumps(data)), EVENTS) == msg
    assert decode(pickle.loads(pickle.dumps(data)), EVENTS) == msg


@pytest.mark.parametrize("msg", ORDER_EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_order_survives_a_json_round_trip(msg):
    assert decode(json.loads(json.dumps(msg.to_dict())), ORDERS) == msg


def test_wire_form_is_plain_data_with_role_values():
    assert SwitchTo(cell=0, role=Role.TRAIN, order=1).to_dict() == {
        "type": "SwitchTo", "cell": 0, "role": "train", "order": 1}
    assert RunsChanged(runs=[1, 2], ended=0).to_dict() == {"type": "RunsChanged", "runs": [1, 2], "ended": 0}


def test_unknown_message_type_is_a_protocol_error_listing_the_known_types():
    with pytest.raises(ProtocolError, match=r"'Teleport' is an unknown message type.*Hello, Heartbeat") as exc:
        decode({"type": "Teleport", "cell": 0}, EVENTS, source=3)
    assert exc.value.source == 3
    assert isinstance(exc.value, GyreError)


def test_an_order_where_an_event_is_expected_is_rejected_by_direction():
    with pytest.raises(ProtocolError, match="'SwitchTo' is an order here"):
        decode(SwitchTo(cell=0, role=Role.TRAIN, order=1).to_dict(), EVENTS)
    with pytest.raises(ProtocolError, match="'Heartbeat' is an event here"):
        decode(Heartbeat(cell=0).to_dict(), ORDERS)


@pytest.mark.parametrize("data, match", [
    ({"cell": 0}, "a mapping with a string 'type'"),
    ("Heartbeat", "a mapping with a string 'type'"),
    ({"type": "Heartbeat", "cell": 0, "colour": "red"}, r"Heartbeat\.colour: unknown field; fields of Heartbeat: cell, seq"),
    ({"type": "SwitchDone", "cell": 0, "role": "train"}, r"SwitchDone\.order: missing"),
    ({"type": "Heartbeat", "cell": "0"}, r"Heartbeat\.cell: expected int, got '0'"),
    ({"type": "Heartbeat", "cell": True}, r"Heartbeat\.cell: expected int, got True"),
    ({"type": "Heartbeat", "cell": -1}, r"Heartbeat\.cell: must be >= 0, got -1"),
    ({"type": "SwitchDone", "cell": 0, "role": "sleeping", "order": 1}, r"SwitchDone\.role: 'sleeping' is not one of"),
    ({"type": "SwitchDone", "cell": 0, "role": "draining", "order": 1}, r"SwitchDone\.role: a switch ends in train or"),
    ({"type": "SwitchDone", "cell": 0, "role": "train", "order": 1, "timing": {"drain_s": -1.0}},
     r"SwitchDone\.timing\.drain_s: must be >= 0"),
    ({"type": "SwitchDone", "cell": 0, "role": "train", "order": 1, "timing": {"drain_s": float("nan")}},
     r"SwitchDone\.timing\.drain_s: expected float"),
    ({"type": "SwitchDone", "cell": 0, "role": "train", "order": 1, "timing": {"drain": 1.0}},
     r"SwitchDone\.timing: keys are durations named \*_s"),
    ({"type": "RunsChanged", "runs": [1, -2], "ended": 0}, r"RunsChanged\.runs\[1\]: must be >= 0"),
    ({"type": "RunsChanged", "runs": 3, "ended": 0}, r"RunsChanged\.runs: expected tuple"),
    ({"type": "GroupsReady", "groups": 1, "work_s": -0.5}, r"GroupsReady\.work_s: must be >= 0"),
    ({"type": "TrainProgress", "cell": 0, "version": 1, "optimizing": 1}, r"TrainProgress\.optimizing: expected bool"),
    ({"type": "EngineDied", "cell": 1, "pid": 7}, r"EngineDied\.exit_code: missing"),
    ({"type": "EngineDied", "cell": 1, "pid": 7, "exit_code": -9, "calls_moved": -1},
     r"EngineDied\.calls_moved: must be >= 0"),
    ({"type": "EngineRestarted", "cell": 1, "pid": 7, "start_s": -2.0, "version": 0},
     r"EngineRestarted\.start_s: must be >= 0"),
    ({"type": "EngineRestarted", "cell": 1, "pid": 7, "start_s": 2.0, "version": 0, "restarts": 0},
     r"EngineRestarted\.restarts: must be >= 1"),
])
def test_malformed_events_name_the_type_and_field(data, match):
    with pytest.raises(ProtocolError, match=match):
        decode(data, EVENTS)


def test_a_shutdown_names_lost_cells_as_counts():
    with pytest.raises(ProtocolError, match=r"Shutdown\.lost\[1\]: expected int, got 'x'"):
        decode({"type": "Shutdown", "lost": [1, "x"]}, ORDERS)
    assert Shutdown(lost=[3]).lost == (3,)


def test_invalid_messages_cannot_be_constructed_either():
    with pytest.raises(ProtocolError, match=r"SwitchTo\.role: a cell switches to train or rollout"):
        SwitchTo(cell=0, role=Role.LOST, order=1)
    with pytest.raises(ProtocolError, match=r"Welcome\.mu: must be >= 1 or None"):
        Welcome(cell=0, role=Role.ROLLOUT, core=0, streaming=True, mu=0)
    with pytest.raises(ProtocolError, match=r"TrainProgress\.version: must be >= 0"):
        TrainProgress(cell=0, version=-1)


def test_messages_are_frozen_and_timing_is_copied():
    timing = {"drain_s": 1.0}
    msg = SwitchDone(cell=0, role=Role.TRAIN, order=1, timing=timing)
    timing["drain_s"] = 99.0
    assert msg.timing == {"drain_s": 1.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.cell = 1
