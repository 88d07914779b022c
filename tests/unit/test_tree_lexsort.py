"""LCP-aware lexicographic sort of call sequences read in place, against Python's sort of concatenated copies."""
import numpy as np
import pytest

from gyre_hpc.trajectory.lexsort import Seqs, sort_with_lcp


def reference(pairs):
    seqs = [tuple(np.concatenate([a, b]).tolist()) for a, b in pairs]
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])  # stable: ties keep file order

    def lcp(x, y):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        return n

    return order, [0] + [lcp(seqs[order[k - 1]], seqs[order[k]]) for k in range(1, len(order))]


def branching_pairs(rng, n_calls, vocab, scale):
    """Calls that extend, retry or restart earlier contexts, with input/output splits at random points."""
    contexts = [rng.integers(0, vocab, int(rng.integers(1, scale)))]
    pairs = []
    for _ in range(n_calls):
        base = contexts[int(rng.integers(len(contexts)))]
        cut = int(rng.integers(0, len(base) + 1))
        seq = np.concatenate([base[:cut], rng.integers(0, vocab, int(rng.integers(0, scale)))])
        if rng.random() < 0.2:
            seq = base.copy()  # an exact duplicate or prefix
        split = int(rng.integers(1, len(seq) + 1)) if len(seq) else 0
        if split == 0:
            seq, split = np.array([0]), 1
        pairs.append((seq[:split], seq[split:]))
        contexts.append(seq)
    return pairs


@pytest.mark.parametrize("seed", range(30))
def test_order_and_neighbour_lcp_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    pairs = branching_pairs(rng, n_calls=int(rng.integers(1, 30)), vocab=int(rng.integers(2, 5)), scale=12)
    order, lcp = sort_with_lcp(Seqs(*zip(*pairs)))
    want_order, want_lcp = reference(pairs)
    assert order.tolist() == want_order and lcp.tolist() == want_lcp


@pytest.mark.parametrize("seed", range(3))
def test_long_sequences_across_comparison_blocks(seed):
    rng = np.random.default_rng(seed)
    pairs = branching_pairs(rng, n_calls=12, vocab=2, scale=5000)  # shared prefixes span several 1 Ki+ blocks
    order, lcp = sort_with_lcp(Seqs(*zip(*pairs)))
    assert (order.tolist(), lcp.tolist()) == reference(pairs)


def test_copy_into_and_lcp_cross_the_input_output_boundary():
    seqs = Seqs([np.array([1, 2, 3]), np.array([1, 2])], [np.array([4, 5]), np.array([3, 4, 6])])
    out = np.empty(3, np.int64)
    seqs.copy_into(0, 2, out)
    assert out.tolist() == [3, 4, 5]
    assert seqs.lcp(0, 1) == 4 and seqs.lcp(0, 1, start=2) == 4
    assert not seqs.after(0, 1, 4) and seqs.after(1, 0, 4)
