"""Flat and tree packing: every generated token of a kept path trained exactly once, input-only tokens never,
same trained set and advantages in both modes, tree attention = each token sees exactly its ancestors."""
from collections import Counter

import numpy as np
import pytest

from gyre_hpc.config import TrajectoryConfig
from gyre_hpc.errors import TrajectoryError
from gyre_hpc.trajectory.pipeline import build_batch, load_packed, plan, save_packed
from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, TitoLog
from gyre_hpc.trajectory.synth import synth_log

BRANCHY = dict(retry_prob=0.4, compression_prob=0.15, subagent_prob=0.2, version_change_prob=0.5)


def prefix_at(batch, r, i):
    """The tokens from the root to position i of row r, following parents."""
    out = []
    while i >= 0:
        out.append(int(batch.input_ids[r, i]))
        i = int(batch.parent[r, i])
    return tuple(reversed(out))


def trained(batch):
    """Multiset of (prefix, advantage, old_logprob, version) over loss_mask == 1 positions."""
    assert set(np.unique(batch.loss_mask).tolist()) <= {0.0, 1.0}
    return Counter((prefix_at(batch, r, i), float(batch.advantage[r, i]), float(batch.old_logprob[r, i]),
                    int(batch.version[r, i])) for r, i in zip(*np.nonzero(batch.loss_mask)))


def expected(log, cfg):
    """From the calls alone: the outputs lying on kept paths of trained runs, first generator's logprob."""
    p = plan(log, cfg)
    want = Counter()
    for it in p.items:
        calls = log.runs[it.run_id]
        kept = [tuple(calls[it.tree.leaf_call[l]].sequence.tolist()) for l in it.leaves]
        on_kept = {s[:d] for s in kept for d in range(1, len(s) + 1)}
        first = {}
        for c in calls:
            s = tuple(c.sequence.tolist())
            for d in range(len(c.input_ids), len(s)):
                o = d - len(c.input_ids)
                first.setdefault(s[:d + 1], (float(np.float32(c.output_logprobs[o])), int(c.output_versions[o])))
        for pre, (lp, v) in first.items():
            if pre in on_kept:
                want[(pre, float(np.float32(it.advantage)), lp, v)] += 1
    return want, p.report


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("j_max", [1, 3, None])
def test_both_modes_train_each_generated_token_of_kept_paths_exactly_once(seed, j_max):
    log = synth_log(5, 4, seed=seed, **BRANCHY)
    cfg = TrajectoryConfig(j_max=j_max, max_row_tokens=2048)
    want, report = expected(log, cfg)
    assert sum(want.values()) == report.trained_tokens > 0
    for mode in ("tree", "flat"):
        batch, rep = build_batch(log, cfg, mode)
        batch.validate()
        assert trained(batch) == want, mode
        assert batch.trained_tokens == rep.trained_tokens
    tree, _ = build_batch(log, cfg, "tree")
    flat, _ = build_batch(log, cfg, "flat")
    assert (tree.tokens, flat.tokens) == (report.tree_tokens, report.flat_tokens)
    assert tree.tokens <= flat.tokens


def test_input_only_tokens_carry_no_loss_logprob_or_version():
    log = synth_log(4, 4, seed=7, **BRANCHY)
    for mode in ("tree", "flat"):
        batch, _ = build_batch(log, TrajectoryConfig(max_row_tokens=2048), mode)
        valid = np.arange(batch.shape[1])[None, :] < batch.lengths[:, None]
        not_generated = valid & (batch.version < 0)
        assert not_generated.any() and (batch.loss_mask[not_generated] == 0).all()
        assert (batch.old_logprob[not_generated] == 0).all() and (batch.advantage[batch.loss_mask == 0] == 0).all()
        assert (batch.loss_mask[batch.position_ids == 0] == 0).all()  # the first token of a path is never trained


def test_tree_rows_attend_exactly_ancestors_and_positions_are_depths():
    batch, _ = build_batch(synth_log(3, 3, seed=2, **BRANCHY), TrajectoryConfig(max_row_tokens=2048), "tree")
    for r in range(batch.shape[0]):
        allowed = batch.attention_allowed(r)
        for i in range(int(batch.lengths[r])):
            anc, j = set(), i
            while j >= 0:
                anc.add(j)
                j = int(batch.parent[r, j])
            assert set(np.flatnonzero(allowed[i]).tolist()) == anc
            assert batch.position_ids[r, i] == len(anc) - 1
        for i in range(int(batch.lengths[r]), batch.shape[1]):  # padding attends itself only
            assert np.flatnonzero(allowed[i]).tolist() == [i]


def test_flat_row_repeats_shared_prefix_but_trains_it_once():
    s, q, a, b, x = 1, 2, 3, 4, 5
    log = TitoLog((Call.of("q0-r0", "c0", [s, q], [a, b]), Call.of("q0-r0", "c1", [s, q], [a, x]),
                   Call.of("q0-r1", "c0", [s, q], [x])),
                  (Outcome("q0-r0", "q0", RunStatus.SCORED, 1.0), Outcome("q0-r1", "q0", RunStatus.SCORED, 0.0)))
    flat, _ = build_batch(log, TrajectoryConfig(), "flat")
    rows = {tuple(flat.input_ids[r, :flat.lengths[r]].tolist()): flat.loss_mask[r, :flat.lengths[r]].tolist()
            for r in range(flat.shape[0])}
    assert rows == {(s, q, a, x): [0, 0, 1, 1], (s, q, a, b): [0, 0, 0, 1], (s, q, x): [0, 0, 1]}
    tree, _ = build_batch(log, TrajectoryConfig(), "tree")
    assert tree.shape[0] == 1 and tree.input_ids[0].tolist() == [s, q, a, b, x, s, q, x]
    assert tree.loss_mask[0].tolist() == [0, 0, 1, 1, 1, 0, 0, 1]


def test_rows_respect_max_row_tokens_and_keep_each_run_tree_whole():
    log = synth_log(6, 4, seed=3, **BRANCHY)
    report = plan(log, TrajectoryConfig(j_max=None)).report
    biggest = max(r.tree_tokens for r in report.per_run)
    batch, _ = build_batch(log, TrajectoryConfig(j_max=None, max_row_tokens=biggest), "tree")
    assert batch.lengths.max() <= biggest and batch.tokens == report.tree_tokens
    roots = (batch.parent == -1) & (np.arange(batch.shape[1])[None, :] < batch.lengths[:, None])
    assert roots.sum() >= report.runs_trained  # each run tree starts at least one root
    assert batch.shape[0] < report.runs_trained  # several runs share a row


def test_a_tree_longer_than_a_row_is_an_error_naming_the_run_and_the_fix():
    log = synth_log(2, 2, seed=1, **BRANCHY)
    with pytest.raises(TrajectoryError, match=r"run q\d-r\d: its tree .* more than trajectory\.max_row_tokens=8; "
                                              r"raise trajectory\.max_row_tokens, lower trajectory\.j_max"):
        build_batch(log, TrajectoryConfig(max_row_tokens=8), "tree")
    with pytest.raises(TrajectoryError, match=r"run q\d-r\d: the path ending at call c\d+ has \d+ tokens"):
        build_batch(log, TrajectoryConfig(max_row_tokens=8), "flat")


def test_nothing_to_train_gives_an_empty_valid_batch():
    log = TitoLog((Call.of("q0-r0", "c0", [1], [2]),), (Outcome("q0-r0", "q0", RunStatus.EVAL_FAILURE, None),))
    batch, rep = build_batch(log, TrajectoryConfig(), "tree")
    assert batch.validate().shape == (0, 0) and rep.trained_tokens == 0 and rep.eval_failures == 1


def test_saved_batch_loads_back_identically(tmp_path):
    batch, rep = build_batch(synth_log(2, 3, seed=4), TrajectoryConfig(), "tree")
    save_packed(tmp_path / "out", batch, rep)
    back = load_packed(tmp_path / "out")
    for name in ("input_ids", "parent", "span_end", "loss_mask", "advantage", "lengths"):
        np.testing.assert_array_equal(getattr(back, name), getattr(batch, name))
    with pytest.raises(TrajectoryError, match="not a packed batch"):
        load_packed(tmp_path)
