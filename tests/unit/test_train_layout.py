"""Compute layout: cutting packed rows into trees and grouping rows by length keeps every token's context."""
import numpy as np
import pytest

from gyre_hpc.config import TrajectoryConfig
from gyre_hpc.train.layout import micro_batches, split_trees
from gyre_hpc.trajectory.pipeline import build_batch
from gyre_hpc.trajectory.synth import synth_log


@pytest.fixture(scope="module")
def packed():
    batch, _ = build_batch(synth_log(4, 4, seed=3), TrajectoryConfig(j_max=None, max_row_tokens=1024), "tree")
    assert batch.shape[0] < int((batch.parent[:, :] < 0).sum())  # several trees share a row
    return batch


def test_split_trees_gives_each_tree_its_own_row_with_its_context(packed):
    rows = split_trees(packed).validate()
    assert rows.tokens == packed.tokens and rows.trained_tokens == packed.trained_tokens
    k = 0
    for r in range(packed.shape[0]):
        n = int(packed.lengths[r])
        allowed = packed.attention_allowed(r)
        for s in np.nonzero(packed.parent[r, :n] < 0)[0]:
            e = int(packed.span_end[r, s]) + 1
            m = int(rows.lengths[k])
            assert m == e - s
            for name in ("input_ids", "position_ids", "loss_mask", "advantage", "old_logprob", "version"):
                assert np.array_equal(getattr(rows, name)[k, :m], getattr(packed, name)[r, s:e])
            assert np.array_equal(rows.attention_allowed(k)[:m, :m], allowed[s:e, s:e])
            assert not allowed[s:e, :s].any() and not allowed[s:e, e:].any()  # trees never see each other
            k += 1
    assert k == rows.shape[0]


def test_padding_of_new_rows_is_inert(packed):
    rows = split_trees(packed)
    L = rows.shape[1]
    for k in range(rows.shape[0]):
        pad = np.arange(int(rows.lengths[k]), L)
        assert (rows.parent[k, pad] == -1).all() and (rows.span_end[k, pad] == pad).all()
        assert (rows.loss_mask[k, pad] == 0).all() and (rows.input_ids[k, pad] == 0).all()


@pytest.mark.parametrize("budget", [None, 1, 300, 2000])
def test_micro_batches_hold_every_row_once_within_the_budget(packed, budget):
    rows = split_trees(packed)
    groups = micro_batches(rows, budget)
    assert sum(g.shape[0] for g in groups) == rows.shape[0]
    assert sum(g.trained_tokens for g in groups) == rows.trained_tokens
    seen = sorted(tuple(g.input_ids[i, : g.lengths[i]]) for g in groups for i in range(g.shape[0]))
    assert seen == sorted(tuple(rows.input_ids[i, : rows.lengths[i]]) for i in range(rows.shape[0]))
    for g in groups:
        g.validate()
        assert g.shape[1] == int(g.lengths.max())  # padding columns trimmed
        assert budget is None or g.shape[0] == 1 or g.shape[0] * g.shape[1] <= budget
    if budget is None:
        assert len(groups) == 1
    if budget == 1:
        assert len(groups) == rows.shape[0]


@pytest.mark.parametrize("split,budget", [(True, None), (True, 300), (False, 1), (False, None)])
def test_layout_origin_maps_every_valid_position_of_every_part_back_to_the_batch_once(packed, split, budget):
    from gyre_hpc.train.layout import layout

    parts = layout(packed, split, budget)
    expect = micro_batches(split_trees(packed) if split else packed, budget)
    assert [p.shape for p, _ in parts] == [e.shape for e in expect]
    seen = []
    for part, origin in parts:
        valid = np.arange(part.shape[1])[None, :] < part.lengths[:, None]
        assert ((origin >= 0) == valid).all()
        for name in ("input_ids", "position_ids", "loss_mask", "old_logprob", "version"):
            assert np.array_equal(getattr(packed, name).reshape(-1)[origin[valid]], getattr(part, name)[valid])
        seen += origin[valid].tolist()
    assert sorted(seen) == sorted(np.flatnonzero(np.arange(packed.shape[1])[None, :] < packed.lengths[:, None]))


@pytest.mark.parametrize("rule", ["cut", "drop"])
def test_cut_overlong_keeps_valid_trees_with_each_kept_tokens_ancestors_and_counts_the_rest(packed, rule):
    from gyre_hpc.train.layout import cut_overlong

    deepest = int(packed.position_ids.max())
    limit = int(np.median(packed.position_ids[packed.position_ids > 0])) if rule == "cut" else deepest
    cut, origin, counts = cut_overlong(packed, limit, rule)
    cut.validate()
    assert int(cut.position_ids.max()) < limit
    assert counts["overlong_tokens_cut"] == packed.tokens - cut.tokens > 0
    assert counts["overlong_trained_tokens_cut"] == packed.trained_tokens - cut.trained_tokens
    flat_in = {name: getattr(packed, name).reshape(-1) for name in ("input_ids", "position_ids", "loss_mask")}
    for r in range(cut.shape[0]):
        n = int(cut.lengths[r])
        src = origin[r, :n]
        assert (src >= 0).all() and (origin[r, n:] == -1).all()
        for name, arr in flat_in.items():
            assert np.array_equal(getattr(cut, name)[r, :n], arr[src])
        # a kept token's ancestors are exactly its ancestors in the input (the parent chain maps through origin)
        par = cut.parent[r, :n]
        assert np.array_equal(np.where(par >= 0, src[np.maximum(par, 0)], -1) % packed.shape[1],
                              np.where(par >= 0, packed.parent.reshape(-1)[src], -1) % packed.shape[1])
    if rule == "cut":
        assert cut.tokens == int(((packed.position_ids < limit) & (packed.input_ids * 0 == 0)
                                  & (np.arange(packed.shape[1]) < packed.lengths[:, None])).sum())
    same, none, zero = cut_overlong(packed, deepest + 1, rule)
    assert same is packed and none is None and zero["overlong_tokens_cut"] == 0
