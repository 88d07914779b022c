"""Workloads: parametric model, trace reading (with file:line errors), and the trace round trip."""
import numpy as np
import pytest

from gyre_hpc.allocator.sim import workload as wlm
from gyre_hpc.config import SimConfig, WorkloadConfig, load_config
from gyre_hpc.errors import ConfigError, WorkloadError

SIM = SimConfig()


def test_parametric_is_deterministic_and_grouped():
    cfg = WorkloadConfig(runs_per_query=3, stuck_query_frac=0.3)
    a, b = wlm.parametric(cfg, SIM, 50, 7), wlm.parametric(cfg, SIM, 50, 7)
    assert np.array_equal(a.work_s, b.work_s) and a.queries == 50 and a.max_group == 3
    stuck = ~np.isfinite(a.work_s).reshape(50, 3)
    assert (stuck.all(axis=1) | ~stuck.any(axis=1)).all()  # a stuck query's runs all never finish
    assert 0 < stuck.all(axis=1).mean() < 0.6
    assert not np.array_equal(a.work_s, wlm.parametric(cfg, SIM, 50, 8).work_s)


def test_trace_round_trip(tmp_path):
    cfg = WorkloadConfig(runs_per_query=2, stuck_query_frac=0.2, path_turns=10.0)
    wl = wlm.parametric(cfg, SIM, 20, 0, j_max=2)
    path = tmp_path / "trace.jsonl"
    wlm.write_trace(path, wl, timeout_s=3600.0)
    back = wlm.read_trace(path, SIM)
    assert np.array_equal(back.offsets, wl.offsets)
    assert np.array_equal(np.isfinite(back.work_s), np.isfinite(wl.work_s))
    finite = np.isfinite(wl.work_s)
    assert np.allclose(back.work_s[finite], wl.work_s[finite])
    assert np.allclose(back.tok_per_work_s[finite], wl.tok_per_work_s[finite])
    assert np.allclose(back.train_window_s[finite], wl.train_window_s[finite])


def test_trace_with_turn_costs_and_cycling(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('# two queries\n'
                    '{"query": "a", "prefill_tokens": 10000, "decode_tokens": 300, "tool_s": 100}\n\n'
                    '{"query": "b", "duration_s": 50, "tokens": 500, "timed_out": true}\n'
                    '{"query": "a", "prefill_tokens": 0, "decode_tokens": 30, "tool_s": 0}\n')
    wl = wlm.read_trace(path, SimConfig(prefill_tok_s=1000.0, decode_tok_s=30.0))
    assert list(wl.offsets) == [0, 2, 3]
    assert wl.work_s[0] == pytest.approx(100 + 10 + 10) and wl.work_s[1] == pytest.approx(1.0)
    assert wl.work_s[2] == np.inf  # a timed-out run would have gone on
    assert wl.take(5).queries == 5 and list(wl.take(3).offsets) == [0, 2, 3, 5]


@pytest.mark.parametrize("line, message", [
    ("{not json", "invalid JSON"),
    ('{"duration_s": 5, "tokens": 1}', "string or integer 'query'"),
    ('{"query": 1, "duration_s": -5, "tokens": 1}', "duration_s must be a number >= 0"),
    ('{"query": 1, "tokens": 1}', "needs prefill_tokens"),
    ('{"query": 1, "duration_s": 0, "tokens": 1}', "must take time"),
    ('{"query": 1, "duration_s": 5, "tokens": 1, "timed_out": "yes"}', "timed_out must be true or false"),
])
def test_malformed_trace_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"query": 0, "duration_s": 5, "tokens": 1}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=rf"bad\.jsonl:2: .*{message}"):
        wlm.read_trace(path, SIM)


def test_missing_trace_is_a_workload_error(tmp_path):
    with pytest.raises(WorkloadError, match="workload.trace: file not found"):
        wlm.load(WorkloadConfig(trace=str(tmp_path / "none.jsonl")), SIM, 10, 0, j_max=5)


@pytest.mark.parametrize("override, key", [
    ("workload.timeout_h=-1", r"workload\.timeout_h: must be > 0"),
    ("workload.tool_s_per_turn=-3", r"workload\.tool_s_per_turn: must be >= 0"),
    ("workload.stuck_query_frac=1.0", r"workload\.stuck_query_frac"),
    ("sim.policies=[gyre,nope]", r"sim\.policies\[1\]: 'nope' is not one of"),
    ("sim.optimizer_s=-1", r"sim\.optimizer_s: must be >= 0"),
])
def test_bad_workload_and_sim_values_name_the_dotted_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config("configs/sim/small.yaml", [override])
