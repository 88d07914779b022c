"""FixedBatches after a resume that re-issues the queries in flight at the preemption: the admission order is the
re-issued gids, then the new ones, and batches are cut from that order B at a time."""
import pytest

from gyre_hpc.allocator.batches import FixedBatches


def test_reissued_queries_head_the_admission_order_and_batches_follow_it():
    fb = FixedBatches(2, base=10, first=(5, 8))
    assert fb.ready(10, "g10") == []
    assert fb.ready(8, "g8") == []  # batch [5, 8] waits for 5
    assert fb.ready(11, "g11") == []  # batch [10, 11] is complete but waits for the re-issued batch
    assert fb.ready(5, "g5") == [["g5", "g8"], ["g10", "g11"]]
    assert fb.holding() == []


def test_an_odd_count_of_reissued_queries_shares_a_batch_with_the_first_new_one():
    fb = FixedBatches(2, base=10, first=(7,))
    assert fb.ready(7, "g7") == []
    assert fb.ready(10, "g10") == [["g7", "g10"]]
    assert fb.ready(12, "g12") == []
    assert fb.ready(11, "g11") == [["g11", "g12"]]


def test_a_gid_neither_reissued_nor_new_is_refused():
    fb = FixedBatches(2, base=10, first=(7,))
    with pytest.raises(ValueError, match="group 6"):
        fb.ready(6, "g6")
    with pytest.raises(ValueError, match="below base"):
        FixedBatches(2, base=10, first=(10,))
