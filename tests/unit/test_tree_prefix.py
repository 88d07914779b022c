"""Prefix tree invariants, checked against a plain dict-of-prefixes reference on random branching runs."""
import numpy as np
import pytest

from gyre_hpc.errors import TrajectoryError
from gyre_hpc.trajectory.records import Call
from gyre_hpc.trajectory.tree import build_tree

S, Q, A, B, T, C, X, Y = range(1, 9)


def diagram_calls():
    return [Call.of("r", "c0", [S, Q], [A, B]), Call.of("r", "c1", [S, Q, A, B, T], [C]),
            Call.of("r", "c2", [S, Q], [X, Y])]


def prefixes_of(tree):
    """Each node's full prefix (tuple of tokens), by walking parents."""
    t = tree.nodes
    out = []
    for i in range(len(t)):
        path, j = [], i
        while j >= 0:
            path.append(int(t.tokens[j]))
            j = int(t.parent[j])
        out.append(tuple(reversed(path)))
    return out


def random_run(rng, n_calls=8, vocab=3):
    """Calls that continue, retry (re-send an earlier input) or restart, over a tiny vocabulary."""
    calls, contexts = [], [list(rng.integers(0, vocab, 3))]
    for i in range(n_calls):
        u = rng.random()
        if u < 0.3 and calls:
            inp = list(calls[int(rng.integers(len(calls)))].input_ids)  # retry
        elif u < 0.4:
            inp = list(rng.integers(0, vocab, int(rng.integers(1, 4))))  # new context
        else:
            inp = contexts[-1] + list(rng.integers(0, vocab, int(rng.integers(0, 3))))
            inp = inp or [0]
        out = list(rng.integers(0, vocab, int(rng.integers(0, 4))))
        lp = -rng.random(len(out))
        calls.append(Call.of("r", f"c{i}", inp, out, logprobs=lp, version=i))
        contexts.append(inp + out)
    return calls


def test_diagram_from_the_module_docstring():
    tree = build_tree(diagram_calls())
    t = tree.nodes
    assert t.tokens.tolist() == [S, Q, A, B, T, C, X, Y]
    assert t.parent.tolist() == [-1, 0, 1, 2, 3, 4, 1, 6]
    assert t.depth.tolist() == [0, 1, 2, 3, 4, 5, 2, 3]
    assert t.span_end.tolist() == [7, 7, 5, 5, 5, 5, 7, 7]
    assert t.generated.tolist() == [False, False, True, True, False, True, True, True]
    assert tree.n_leaves == 2 and tree.call_leaf.tolist() == [0, 0, 1]


@pytest.mark.parametrize("seed", range(40))
def test_each_distinct_prefix_is_one_node_and_every_call_is_a_root_path(seed):
    calls = random_run(np.random.default_rng(seed))
    tree = build_tree(calls)
    prefixes = prefixes_of(tree)
    seqs = [tuple(c.sequence.tolist()) for c in calls]
    assert len(set(prefixes)) == len(prefixes)
    assert set(prefixes) == {s[:d] for s in seqs for d in range(1, len(s) + 1)}
    for c, s in enumerate(seqs):
        nodes = tree.path_nodes(int(tree.call_leaf[c]))[:len(s)]
        assert tuple(tree.nodes.tokens[nodes].tolist()) == s
    leaves = {s for s in seqs if not any(o != s and o[:len(s)] == s for o in seqs)}
    assert tree.n_leaves == len(leaves)


@pytest.mark.parametrize("seed", range(40))
def test_preorder_parents_depths_and_subtree_spans(seed):
    tree = build_tree(random_run(np.random.default_rng(seed)))
    t = tree.nodes
    n = len(t)
    has = t.parent >= 0
    assert np.all(t.parent[has] < np.arange(n)[has])
    assert np.all(t.depth[has] == t.depth[t.parent[has]] + 1) and np.all(t.depth[~has] == 0)
    prefixes = prefixes_of(tree)
    for i in range(n):  # the subtree of i is exactly i..span_end[i]
        inside = [j for j in range(n) if prefixes[j][:len(prefixes[i])] == prefixes[i]]
        assert inside == list(range(i, int(t.span_end[i]) + 1))


@pytest.mark.parametrize("seed", range(40))
def test_generated_iff_some_call_output_it_and_first_generator_wins(seed):
    calls = random_run(np.random.default_rng(seed))
    tree = build_tree(calls)
    t = tree.nodes
    first: dict[tuple, tuple[int, float]] = {}
    for ci, c in enumerate(calls):
        s = tuple(c.sequence.tolist())
        for d in range(len(c.input_ids), len(s)):
            first.setdefault(s[:d + 1], (ci, float(np.float32(c.output_logprobs[d - len(c.input_ids)]))))
    for i, p in enumerate(prefixes_of(tree)):
        assert bool(t.generated[i]) == (p in first)
        if p in first:
            assert (int(tree.gen_call[i]), float(t.logprob[i]), int(t.version[i])) == \
                   (first[p][0], first[p][1], first[p][0])
        else:
            assert (t.logprob[i], t.version[i]) == (0.0, -1)
    assert not t.generated[t.depth == 0].any()  # a root is always an input token


def test_input_only_tokens_are_not_generated_even_when_equal_to_an_output_elsewhere():
    # the tool echoes token A; after "S Q" A was generated, after "S Q A B T" it is input only
    tree = build_tree([Call.of("r", "c0", [S, Q], [A, B]), Call.of("r", "c1", [S, Q, A, B, T, A], [C])])
    t = tree.nodes
    assert [(int(a), bool(g)) for a, g in zip(t.tokens, t.generated)] == \
           [(S, False), (Q, False), (A, True), (B, True), (T, False), (A, False), (C, True)]


def test_restrict_is_the_subtree_of_the_kept_leaves():
    calls = diagram_calls() + [Call.of("r", "c3", [S, Q, X], [C])]
    tree = build_tree(calls)
    sub = tree.restrict([int(tree.call_leaf[3])])
    assert sub.tokens.tolist() == [S, Q, X, C] and sub.parent.tolist() == [-1, 0, 1, 2]
    assert sub.span_end.tolist() == [3, 3, 3, 3] and sub.generated.tolist() == [False, False, True, True]
    both = tree.restrict([int(tree.call_leaf[1]), int(tree.call_leaf[3])])
    assert both.tokens.tolist() == [S, Q, A, B, T, C, X, C]
    assert both.parent.tolist() == [-1, 0, 1, 2, 3, 4, 1, 6] and both.span_end.tolist()[:2] == [7, 7]


def test_identical_sequences_are_one_leaf_and_a_forest_is_allowed():
    tree = build_tree([Call.of("r", "c0", [S], [A]), Call.of("r", "c1", [S], [A]), Call.of("r", "c2", [X], [Y])])
    assert tree.n_leaves == 2 and tree.nodes.parent.tolist() == [-1, 0, -1, 2]
    assert tree.gen_call.tolist() == [-1, 0, -1, 2]


def test_empty_runs_and_empty_inputs_are_errors():
    with pytest.raises(TrajectoryError, match="without calls"):
        build_tree([])
    with pytest.raises(TrajectoryError, match="empty input"):
        build_tree([Call.of("r", "c0", [], [A])])
