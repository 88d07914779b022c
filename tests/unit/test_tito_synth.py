"""Synthetic TITO logs: deterministic for a seed, valid, small by default, and controlled by their knobs."""
import numpy as np
import pytest

from gyre_hpc.config import TrajectoryConfig
from gyre_hpc.trajectory.pipeline import build_batch, plan
from gyre_hpc.trajectory.records import RunStatus, read_tito, write_tito
from gyre_hpc.trajectory.synth import synth_log


def test_same_seed_same_bytes_other_seed_other_log(tmp_path):
    a = synth_log(4, 3, seed=9)
    b = synth_log(4, 3, seed=9)
    c = synth_log(4, 3, seed=10)
    pa, pb, pc = (write_tito(tmp_path / f"{n}.jsonl", x.calls, x.outcomes) for n, x in zip("abc", (a, b, c)))
    assert pa.read_bytes() == pb.read_bytes() != pc.read_bytes()


def test_defaults_are_tiny_valid_and_fit_a_vocab_256_model(tmp_path):
    log = synth_log(8, 4, seed=0)
    back = read_tito(write_tito(tmp_path / "s.jsonl", log.calls, log.outcomes), vocab_size=256)
    report = plan(back, TrajectoryConfig(j_max=None)).report
    lengths = [max(len(c.sequence) for c in calls) for calls in back.runs.values() if calls]
    assert 10 <= np.mean(lengths) and max(lengths) <= 256
    assert max(r.tree_tokens for r in report.per_run) <= 512
    build_batch(back, TrajectoryConfig(max_row_tokens=512), "tree")[0].validate()


def test_outcome_rates_follow_the_knobs():
    none = synth_log(10, 10, seed=1, timeout_rate=0.0, eval_failure_rate=0.0)
    assert {o.status for o in none.outcomes} == {RunStatus.SCORED}
    bad = synth_log(10, 10, seed=1, timeout_rate=0.0, eval_failure_rate=1.0)
    assert {o.status for o in bad.outcomes} == {RunStatus.EVAL_FAILURE} and all(o.score is None for o in bad.outcomes)
    late = synth_log(10, 10, seed=1, timeout_rate=1.0, partial_rate=0.5)
    assert {o.status for o in late.outcomes} == {RunStatus.TIMEOUT_PARTIAL, RunStatus.TIMEOUT_UNSCORABLE}
    assert any(c.finish_reason == "length" for c in late.calls)


def test_branch_knobs_change_the_shape():
    linear = plan(synth_log(6, 4, seed=2, retry_prob=0, compression_prob=0, subagent_prob=0), TrajectoryConfig())
    assert set(linear.report.branches) == {"root", "continuation"}
    assert linear.report.tree_tokens == linear.report.flat_tokens  # one path per run, nothing shared
    branchy = plan(synth_log(6, 4, seed=2, retry_prob=0.5, subagent_prob=0.3), TrajectoryConfig(j_max=None))
    assert branchy.report.tree_tokens < branchy.report.flat_tokens


def test_lengths_and_vocab_knobs():
    log = synth_log(2, 2, seed=3, vocab_size=50, output_len=(7, 7), turns=(3, 3), timeout_rate=0.0, retry_prob=0,
                    compression_prob=0, subagent_prob=0)
    assert all(len(c.output_ids) == 7 for c in log.calls) and len(log.calls) == 12
    assert max(int(c.sequence.max()) for c in log.calls) < 50


def test_unknown_knob_is_rejected():
    with pytest.raises(TypeError, match="unknown knob"):
        synth_log(1, 1, seed=0, retries=0.5)


def test_every_knob_is_documented():
    from gyre_hpc.trajectory.synth import DEFAULTS, KNOB_DOCS

    assert set(KNOB_DOCS) == set(DEFAULTS) and all(KNOB_DOCS.values())
