"""Fixed batches as the simulator forms them: whole, in admission order, each waiting for its slowest group."""
import pytest

from gyre_hpc.allocator.batches import FixedBatches


def test_a_batch_goes_out_only_when_all_its_groups_are_ready_in_admission_order():
    fb = FixedBatches(3)
    assert fb.ready(2, "g2") == [] and fb.ready(0, "g0") == []
    assert fb.ready(1, "g1") == [["g0", "g1", "g2"]]
    assert fb.holding() == []


def test_a_later_batch_that_completes_first_waits_for_the_earlier_one():
    fb = FixedBatches(2)
    assert fb.ready(2, "g2") == [] and fb.ready(3, "g3") == [] and fb.ready(0, "g0") == []
    assert fb.holding() == ["g0", "g2", "g3"]
    assert fb.ready(1, "g1") == [["g0", "g1"], ["g2", "g3"]]


def test_after_a_resume_batches_count_from_the_first_new_group():
    fb = FixedBatches(2, base=7)
    assert fb.ready(8, "g8") == [] and fb.ready(7, "g7") == [["g7", "g8"]]
    with pytest.raises(ValueError, match="group 7 is ready twice"):
        fb.ready(7, "again")
    with pytest.raises(ValueError, match="batch_groups must be >= 1"):
        FixedBatches(0)
