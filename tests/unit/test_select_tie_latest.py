"""J_max ties go to the latest path (record order), never to the first path by token id.

A call that re-sends a prefix of several paths lies on each of them, so "the path of the final call" and "the
path with the most recent call" can name several paths: the one whose own call (its leaf's sequence) is the
latest in the file wins.
"""
import numpy as np
import pytest

from gyre_hpc.config import TrajectoryConfig
from gyre_hpc.trajectory.pipeline import plan
from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, TitoLog
from gyre_hpc.trajectory.select import select_paths
from gyre_hpc.trajectory.synth import synth_log
from gyre_hpc.trajectory.tree import build_tree

S, Q = 1, 2


def leaf_ids(calls, tree, leaves):
    return [calls[tree.leaf_call[i]].call_id for i in leaves]


@pytest.mark.parametrize("older,newer", [(15, 20), (20, 15)], ids=["latest-sorts-last", "latest-sorts-first"])
@pytest.mark.parametrize("rule", ["final_then_recent", "final_then_longest", "longest"])
def test_j_max_1_keeps_the_latest_of_the_paths_the_final_call_lies_on(older, newer, rule):
    # c0: S Q | 10 older      the final call c2 (S Q | 10) is a prefix of both paths:
    # c1: S Q | 10 newer      a tie, which goes to c1's path (the later record), whatever the token order
    # c2: S Q | 10
    calls = [Call.of("q0-r0", "c0", [S, Q], [10, older]), Call.of("q0-r0", "c1", [S, Q], [10, newer]),
             Call.of("q0-r0", "c2", [S, Q], [10])]
    tree = build_tree(calls)
    kept, dropped = select_paths(tree, 1, rule)
    assert leaf_ids(calls, tree, kept) == ["c1"] and leaf_ids(calls, tree, dropped) == ["c0"]
    assert tree.leaf_last_call.tolist() == [2, 2]  # c2 lies on both paths


def test_a_shared_prefix_call_ranks_its_latest_path_first_among_the_others():
    # c2 re-sends S Q 10 (a prefix of c0's and c1's paths), then c3 opens a new path and is final
    calls = [Call.of("q0-r0", "c0", [S, Q], [10, 15]), Call.of("q0-r0", "c1", [S, Q], [10, 20]),
             Call.of("q0-r0", "c2", [S, Q], [10]), Call.of("q0-r0", "c3", [S, Q], [30])]
    tree = build_tree(calls)
    kept, _ = select_paths(tree, 2, "final_then_recent")
    assert leaf_ids(calls, tree, kept) == ["c3", "c1"]


def test_the_report_names_the_latest_path_as_selected():
    calls = (Call.of("q0-r0", "c0", [S, Q], [10, 15]), Call.of("q0-r0", "c1", [S, Q], [10, 20]),
             Call.of("q0-r0", "c2", [S, Q], [10]), Call.of("q0-r1", "c0", [S, Q], [11]))
    outcomes = (Outcome("q0-r0", "q0", RunStatus.SCORED, 1.0), Outcome("q0-r1", "q0", RunStatus.SCORED, 0.0))
    run = plan(TitoLog(calls, outcomes), TrajectoryConfig(j_max=1)).report.per_run[0]
    assert (run.selected, run.dropped) == (("c1",), ("c0",))


def test_every_call_belongs_to_the_latest_path_it_lies_on():
    log = synth_log(8, 4, seed=3, retry_prob=0.6)
    checked = 0
    for calls in log.runs.values():
        if not calls:
            continue
        tree = build_tree(calls)
        recency = tree.leaf_recency
        paths = [calls[int(c)].sequence.tolist() for c in tree.leaf_call]
        assert sorted(recency.tolist()) == list(range(tree.n_leaves))
        for c, call in enumerate(calls):
            seq = call.sequence.tolist()
            on = [i for i, p in enumerate(paths) if p[:len(seq)] == seq]
            assert int(tree.call_leaf[c]) == max(on, key=lambda i: recency[i])
            assert all(tree.leaf_last_call[i] >= c for i in on)
            checked += len(on) > 1
        assert np.all(tree.leaf_own_call <= tree.leaf_last_call)
    assert checked > 0  # the synthetic log has calls that lie on several paths
