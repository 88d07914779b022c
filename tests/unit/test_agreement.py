"""Train-inference agreement records (pure) and the ``train.tis_cap`` key."""
import numpy as np
import pytest

from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.train.agreement import KEYS, combine, empty, record


def test_only_tokens_generated_at_the_trainers_version_are_compared():
    trainer = np.array([-1.21, -0.31, -1.50, -0.69])
    engine = np.array([-1.20, -0.31, -2.00, -0.70])
    rec = record(trainer, engine, np.array([3, 3, 2, 3]), version=3)
    assert rec["logprob_abs_diff_tokens"] == 3
    assert rec["logprob_abs_diff_mean"] == pytest.approx(0.02 / 3)
    assert rec["logprob_abs_diff_max"] == pytest.approx(0.01)
    assert record(trainer, engine, np.array([3, 3, 2, 3]), version=2)["logprob_abs_diff_max"] == pytest.approx(0.5)


def test_no_qualifying_token_gives_null_mean_and_max_not_zero():
    rec = record(np.array([-1.0]), np.array([-2.0]), np.array([0]), version=1)
    assert rec == empty() == {"logprob_abs_diff_mean": None, "logprob_abs_diff_max": None,
                              "logprob_abs_diff_tokens": 0}
    assert combine([]) == empty() and combine([empty(), {}]) == empty()


def test_combining_records_equals_one_record_over_all_their_tokens():
    rng = np.random.default_rng(0)
    parts = [(rng.normal(size=n), rng.normal(size=n), rng.integers(0, 2, n)) for n in (5, 0, 9, 3)]
    whole = record(*(np.concatenate(x) for x in zip(*parts)), version=1)
    combined = combine([record(*p, version=1) for p in parts] + [empty()])
    assert combined[KEYS[2]] == whole[KEYS[2]] > 0
    assert combined[KEYS[0]] == pytest.approx(whole[KEYS[0]]) and combined[KEYS[1]] == whole[KEYS[1]]


def test_tis_cap_is_null_by_default_and_must_be_a_finite_positive_number():
    assert load_config(None, []).train.tis_cap is None
    assert load_config(None, ["train.tis_cap=2"]).train.tis_cap == 2.0
    for bad in ("0", "-1", ".inf", ".nan"):
        with pytest.raises(ConfigError, match=r"train\.tis_cap: must be a finite number > 0 .* or null, got"):
            load_config(None, [f"train.tis_cap={bad}"])
    with pytest.raises(ConfigError, match=r"train\.tis_cap: expected float \| null, got 'high'"):
        load_config(None, ["train.tis_cap=high"])
