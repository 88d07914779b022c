"""Branch kinds from token structure: continuation, retry, compression, subagent (shared or separate system)."""
import pytest

from gyre_hpc.trajectory.branches import BranchKind, classify
from gyre_hpc.trajectory.records import Call
from gyre_hpc.trajectory.synth import synth_with_kinds
from gyre_hpc.trajectory.tree import build_tree

S1, S2, Q, Q2, Z, A1, A2, A3, B1, T1, T2, R = range(10, 22)


def kinds(seqs):
    calls = [Call.of("r", f"c{i}", inp, out) for i, (inp, out) in enumerate(seqs)]
    return [(b.kind, b.source, b.shared) for b in classify(build_tree(calls), calls)]


def test_continuation_extends_the_previous_call():
    assert kinds([([S1, S2, Q], [A1]), ([S1, S2, Q, A1, T1], [A2])]) == [
        (BranchKind.ROOT, None, 0), (BranchKind.CONTINUATION, "c0", 4)]


def test_retry_shares_the_prefix_and_diverges_after_the_opening():
    got = kinds([([S1, S2, Q], [A1]), ([S1, S2, Q, A1, T1], [A2]), ([S1, S2, Q, A1, T1], [A3])])
    assert got[2] == (BranchKind.RETRY, "c1", 5)


def test_retry_of_the_first_call_is_a_retry():
    assert kinds([([S1, S2, Q], [A1, A2]), ([S1, S2, Q], [A3])])[1] == (BranchKind.RETRY, "c0", 3)


def test_compression_shares_only_the_system_prompt_and_replaces_the_context():
    got = kinds([([S1, S2, Q], [A1]), ([S1, S2, Q, A1, T1], [A2]), ([S1, S2, Z], [A3]), ([S1, S2, Z, A3, T2], [A1])])
    assert [k for k, _, _ in got] == [BranchKind.ROOT, BranchKind.CONTINUATION, BranchKind.COMPRESSION,
                                      BranchKind.CONTINUATION]
    assert got[2] == (BranchKind.COMPRESSION, "c1", 2)


def test_subagent_shares_the_system_prompt_and_its_parent_resumes():
    got = kinds([([S1, S2, Q], [A1]), ([S1, S2, Q2], [B1]), ([S1, S2, Q, A1, R], [A2])])
    assert [k for k, _, _ in got] == [BranchKind.ROOT, BranchKind.SUBAGENT, BranchKind.CONTINUATION]


def test_subagent_with_its_own_system_prompt_shares_nothing():
    got = kinds([([S1, S2, Q], [A1]), ([Z, Q2], [B1])])
    assert got[1] == (BranchKind.SUBAGENT, "c0", 0)


def test_a_retry_inside_a_compressed_context_is_a_retry():
    got = kinds([([S1, S2, Q], [A1]), ([S1, S2, Z], [A2]), ([S1, S2, Z], [A3])])
    assert [k for k, _, _ in got][1:] == [BranchKind.COMPRESSION, BranchKind.RETRY]


@pytest.mark.parametrize("seed", range(3))
def test_synthetic_logs_are_classified_as_generated(seed):
    log, meant = synth_with_kinds(12, 4, seed=seed, retry_prob=0.3, compression_prob=0.2, subagent_prob=0.25)
    seen = set()
    for run, calls in log.runs.items():
        if calls:
            for b in classify(build_tree(calls), calls):
                assert b.kind.value == meant[run, b.call_id], (run, b)
                seen.add(b.kind)
    assert seen == set(BranchKind)  # every kind occurred, so the check above covered each


@pytest.mark.parametrize("seed", range(20))
def test_one_kind_per_call_root_first_and_continuation_iff_a_best_matching_earlier_call_is_a_prefix(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    seqs = []
    for i in range(10):
        if seqs and rng.random() < 0.7:
            base = list(seqs[int(rng.integers(len(seqs)))][0 if rng.random() < 0.3 else 1])
            inp = base[:int(rng.integers(1, len(base) + 1))] + list(rng.integers(0, 3, int(rng.integers(0, 3))))
        else:
            inp = list(rng.integers(0, 3, int(rng.integers(1, 4))))
        out = list(rng.integers(0, 3, int(rng.integers(0, 3))))
        seqs.append((inp, inp + out))
    calls = [Call.of("r", f"c{i}", inp, full[len(inp):]) for i, (inp, full) in enumerate(seqs)]
    branches = classify(build_tree(calls), calls)
    assert len(branches) == len(calls) and branches[0].kind is BranchKind.ROOT
    for i, b in enumerate(branches[1:], start=1):
        full = seqs[i][1]
        shared = [next((k for k, (x, y) in enumerate(zip(full, seqs[j][1])) if x != y),
                       min(len(full), len(seqs[j][1]))) for j in range(i)]
        best = max(shared)
        is_prefix = any(s == best == len(seqs[j][1]) for j, s in enumerate(shared))
        assert (b.kind is BranchKind.CONTINUATION) == is_prefix and b.kind is not BranchKind.ROOT
        assert b.shared == best
