"""J_max selection: the cap, the rule that picks paths, and the report of what was dropped."""
import numpy as np
import pytest

from gyre_hpc.config import TrajectoryConfig
from gyre_hpc.trajectory.pipeline import build_batch, plan
from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, TitoLog
from gyre_hpc.trajectory.select import generated_per_leaf, rank_leaves, select_paths
from gyre_hpc.trajectory.synth import synth_log
from gyre_hpc.trajectory.tree import build_tree

S, Q = 1, 2


def fan(outputs, final_first=False):
    """One call per output, all retries of the prompt S Q: leaf i is call i (file order)."""
    calls = [Call.of("q0-r0", f"c{i}", [S, Q], out) for i, out in enumerate(outputs)]
    return calls[::-1] if final_first else calls


def test_cap_keeps_final_path_then_most_recent_and_reports_the_rest():
    calls = fan([[10, 11, 12, 13], [20], [30, 31], [40], [50]])
    tree = build_tree(calls)
    kept, dropped = select_paths(tree, 2, "final_then_recent")
    leaf_ids = lambda leaves: [calls[tree.leaf_call[i]].call_id for i in leaves]
    assert leaf_ids(kept) == ["c4", "c3"] and sorted(leaf_ids(dropped)) == ["c0", "c1", "c2"]
    assert select_paths(tree, None, "final_then_recent")[1] == []


def test_final_then_longest_prefers_generated_tokens_after_the_final_path():
    calls = fan([[10, 11, 12, 13], [20], [30, 31], [40], [50]])
    tree = build_tree(calls)
    assert generated_per_leaf(tree)[tree.call_leaf].tolist() == [4, 1, 2, 1, 1]
    kept, _ = select_paths(tree, 3, "final_then_longest")
    assert [calls[tree.leaf_call[i]].call_id for i in kept] == ["c4", "c0", "c2"]
    kept, _ = select_paths(tree, 2, "longest")
    assert [calls[tree.leaf_call[i]].call_id for i in kept] == ["c0", "c2"]


def test_final_path_is_the_path_of_the_last_call_even_if_it_is_not_a_leaf_call():
    # c2 re-sends a prefix of c0's path last: the answer came from the path that contains it
    calls = [Call.of("q0-r0", "c0", [S, Q], [10, 11]), Call.of("q0-r0", "c1", [S, Q], [20]),
             Call.of("q0-r0", "c2", [S, Q, 10], [11])]
    tree = build_tree(calls)
    kept, _ = select_paths(tree, 1, "final_then_recent")
    assert kept == [int(tree.call_leaf[0])]


@pytest.mark.parametrize("rule", ["final_then_recent", "final_then_longest", "longest"])
@pytest.mark.parametrize("j_max", [1, 2, 3, None])
def test_kept_and_dropped_partition_the_leaves(rule, j_max):
    log = synth_log(6, 3, seed=11, retry_prob=0.6)
    for calls in log.runs.values():
        if calls:
            tree = build_tree(calls)
            kept, dropped = select_paths(tree, j_max, rule)
            assert sorted(kept + dropped) == list(range(tree.n_leaves))
            assert len(kept) == min(tree.n_leaves, j_max or tree.n_leaves)
            if rule.startswith("final"):
                assert kept[0] == int(tree.call_leaf[-1])
            assert rank_leaves(tree, rule) == kept + dropped  # deterministic order


def test_report_counts_paths_dropped_per_run_and_batch_shrinks():
    log = synth_log(6, 3, seed=11, retry_prob=0.6, eval_failure_rate=0.0, timeout_rate=0.0)
    full = plan(log, TrajectoryConfig(j_max=None)).report
    capped = plan(log, TrajectoryConfig(j_max=1)).report
    assert full.paths_dropped == 0 and capped.paths == capped.runs_trained
    assert capped.paths + capped.paths_dropped == full.paths > capped.paths
    for run in capped.per_run:
        if run.trained:
            assert len(run.selected) == 1 and len(run.selected) + len(run.dropped) == run.leaves
    batch, _ = build_batch(log, TrajectoryConfig(j_max=1), "tree")
    assert batch.tokens == capped.tree_tokens == capped.flat_tokens < full.tree_tokens
