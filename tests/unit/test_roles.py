"""Cell roles over time from the allocator's event log (gyre_hpc.allocator.roles)."""
from gyre_hpc.allocator.roles import ROLES, role_share, role_spans

EVENTS = [
    {"event": "start", "t": 0.0, "roles": ["rollout", "rollout"]},
    {"event": "order", "t": 2.0, "order": "switch", "cell": 0, "target": "train"},
    {"event": "switch_done", "t": 3.0, "cell": 0, "role": "train"},
    {"event": "order", "t": 6.0, "order": "switch", "cell": 0, "target": "rollout"},
    {"event": "switch_done", "t": 8.0, "cell": 0, "role": "rollout"},
    {"event": "lost", "t": 9.0, "cell": 1},
    {"event": "stop", "t": 10.0},
]


def test_spans_tile_each_cell_and_shares_sum_to_one():
    spans = role_spans(EVENTS, 2)
    for cell in spans:
        assert cell[0][0] == 0.0 and cell[-1][1] == 10.0
        assert all(a[1] == b[0] for a, b in zip(cell, cell[1:]))
    share = role_share(EVENTS, 2)
    assert set(share) == set(ROLES)
    # 20 cell-seconds: rollout 2+2+9, train 3, draining 1, loading 2, lost 1
    assert share == {"rollout": 0.65, "train": 0.15, "draining": 0.05, "loading": 0.1, "lost": 0.05}
    assert abs(sum(share.values()) - 1.0) < 1e-9


def test_no_time_gives_zero_shares():
    assert role_share([], 3) == {r: 0.0 for r in ROLES}
