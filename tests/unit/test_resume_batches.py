"""A resume puts the fixed batches back as they were (``live.preempt.restore``): a group held for its batch is held
again, in one batch with the queries restarted for it (re-issued: the same gids; dropped: new gids numbered at the
resume), and the server is told to start those first (``readmit``). The harness and the hub are doubles at their
boundary (the real ones run in tests/integration/test_preempt_resume.py and test_preempt_edges.py)."""
from types import SimpleNamespace

from gyre_hpc.allocator.batches import FixedBatches
from gyre_hpc.allocator.state import CellState, SchedState
from gyre_hpc.allocator.types import Role
from gyre_hpc.live import preempt
from gyre_hpc.live.dataplane import Group


class RolloutsDouble:
    """What ``restore`` asks of ``Rollouts``: rebuild a buffered group, set files aside, queue restarts."""

    def __init__(self, batch_groups: int):
        self.batches = FixedBatches(batch_groups)
        self.next_gid, self.pending, self.groups, self.errors = 0, [], [], []

    def rebuild(self, saved: dict) -> Group:
        return Group(saved["gid"], None, 0, gen_versions=tuple(saved["gen_versions"]))

    def set_aside_from(self, next_gid: int) -> list:
        return []

    def reissue(self, gids: list[int]) -> None:
        self.pending = list(gids)


class HubDouble:
    def restore(self, groups, version):
        self.ready, self.version = [g.gid for g in groups], version


def saved_state(buffer: list[tuple[int, bool]], inflight: list[int], next_gid: int) -> dict:
    sched = {"version": 7, "steps_done": 7, "trained_batches": 7, "lag_sum": 0.0, "admitted_queries": next_gid}
    return {"version": 7, "sched": sched, "next_gid": next_gid, "inflight": inflight,
            "counters": {"groups": [], "build_errors": []},
            "buffer": [{"gid": g, "runs": 2, "trained_tokens": 0, "gen_versions": [6], "ready_version": 7,
                        **({} if held is None else {"held": held})} for g, held in buffer]}  # None: no key


def restored(buffer, inflight, next_gid, reissue=True, batch_groups=2):
    server = SimpleNamespace(state=SchedState(cells=[CellState(Role.TRAIN), CellState(Role.ROLLOUT)]), readmit=0)
    hub, rollouts = HubDouble(), RolloutsDouble(batch_groups)
    preempt.restore(saved_state(buffer, inflight, next_gid), server, hub, rollouts, 0.0, reissue)
    return server, hub, rollouts


def test_a_held_group_and_its_reissued_batch_mate_form_their_batch_again():
    server, hub, rollouts = restored([(12, False), (13, False), (14, True)], [15], next_gid=16)
    assert hub.ready == [12, 13] and rollouts.pending == [15] and rollouts.next_gid == 16
    assert server.readmit == 1 and server.state.inflight_groups == 1 and server.state.ready_groups == 2
    assert [g.gid for g in rollouts.batches.holding()] == [14]


def test_the_reissued_query_completes_the_held_batch_and_a_new_one_starts_the_next():
    _, _, rollouts = restored([(14, True)], [15], next_gid=16)
    (batch,) = rollouts.batches.ready(15, "g15")
    assert [getattr(g, "gid", g) for g in batch] == [14, "g15"]
    assert rollouts.batches.ready(16, "g16") == []  # batch [16, 17]


def test_a_drop_numbers_new_queries_for_the_dropped_ones_and_they_complete_the_held_batch():
    server, _, rollouts = restored([(14, True)], [15], next_gid=16, reissue=False)
    assert rollouts.pending == [16] and rollouts.next_gid == 17 and server.readmit == 1
    (batch,) = rollouts.batches.ready(16, "g16")
    assert [getattr(g, "gid", g) for g in batch] == [14, "g16"]


def test_held_groups_of_two_batches_that_a_drop_leaves_whole_go_to_the_hub_at_once():
    server, hub, rollouts = restored([(14, True), (16, True)], [15, 17], next_gid=18, reissue=False)
    assert hub.ready == [14, 16] and server.state.inflight_groups == 0 and server.state.ready_groups == 2
    assert rollouts.pending == [18, 19] and server.readmit == 2 and rollouts.batches.holding() == []


def test_a_state_written_before_held_was_saved_offers_its_whole_buffer():
    server, hub, _ = restored([(14, None)], [15], next_gid=16)
    assert hub.ready == [14] and server.state.inflight_groups == 0 and server.readmit == 1
