"""Staleness split (gyre_hpc/live/dataplane.py): lag = pre-queue part + in-queue part, token by token."""
from types import SimpleNamespace

import numpy as np
import pytest

from gyre_hpc.live.dataplane import lag_record, lag_stats, merge_lag
from gyre_hpc.errors import ProtocolError


def batch(versions, mask):
    return SimpleNamespace(version=np.array(versions), loss_mask=np.array(mask, dtype=np.float32))


def test_each_trained_token_splits_at_the_ready_version():
    # tokens generated at 0, 0, 1, 2 (the one at 5 is a prompt token: not trained); ready at 2, trained at 4
    lag = lag_stats(batch([0, 0, 1, 2, 5], [1, 1, 1, 1, 0]), version=4, ready_version=2)
    assert lag == {"sum": 4 + 4 + 3 + 2, "tokens": 4, "max": 4, "pre_sum": 2 + 2 + 1 + 0, "pre_max": 2,
                   "in_sum": 2 * 4, "in_max": 2}
    assert lag["pre_sum"] + lag["in_sum"] == lag["sum"]


def test_a_step_record_adds_up_over_groups_with_different_queue_times():
    a = lag_stats(batch([0, 1], [1, 1]), version=3, ready_version=1)  # waited 2 versions in the queue
    b = lag_stats(batch([2, 3, 3], [1, 1, 1]), version=3, ready_version=3)  # trained as soon as it was ready
    rec = lag_record(merge_lag(merge_lag(None, a), b))
    assert rec["lag_tokens"] == 5
    assert rec["staleness_mean"] == pytest.approx((3 + 2 + 1 + 0 + 0) / 5)
    assert rec["staleness_prequeue_mean"] == pytest.approx((1 + 0 + 1 + 0 + 0) / 5)
    assert rec["staleness_inqueue_mean"] == pytest.approx((2 + 2) / 5)
    assert rec["staleness_prequeue_mean"] + rec["staleness_inqueue_mean"] == pytest.approx(rec["staleness_mean"])
    assert (rec["staleness_max"], rec["staleness_prequeue_max"], rec["staleness_inqueue_max"]) == (3, 1, 2)


def test_nothing_trained_is_zero_lag_and_versions_out_of_order_are_refused():
    assert lag_stats(None, 3, 1)["tokens"] == 0
    assert lag_record(None)["staleness_mean"] == 0.0
    with pytest.raises(ProtocolError, match="generated up to 2, ready at 1"):
        lag_stats(batch([2], [1]), version=3, ready_version=1)
    with pytest.raises(ProtocolError, match="ready at 4, trained at 3"):
        lag_stats(batch([0], [1]), version=3, ready_version=4)
