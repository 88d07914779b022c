"""Train-inference agreement on a real short RL loop: the local engine samples, the megatron Trainer recomputes.

Both run the same megatron model in float32 on the CPU, so on tokens of the trainer's version the engine's
logprobs and the trainer's agree to float rounding. The negative control samples at another temperature: the
engine then reports logprobs of the tempered distribution, and the metric must see it.
"""
import pytest

from gyre_hpc.config import AgentConfig, EngineConfig, ModelConfig, TrainConfig, TrajectoryConfig

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow]

AGENT = dict(runs_per_group=4, turns=(1, 2), call_tokens=4, answer_tokens=8, tool_output_tokens=(1, 4),
             context_budget=40, tool_time_median_s=0.01, timeout_s=120.0)


def short_loop(tmp_path, temperature: float):
    from gyre_hpc.agents.closed_loop import run_closed_loop

    engine = EngineConfig(max_running_requests=8, context_len=256, request_timeout_s=120.0)
    return run_closed_loop(AgentConfig(**AGENT, temperature=temperature), ModelConfig(),
                           TrainConfig(lr=1e-2, loss="ppo", threads=1, tis_cap=2.0),
                           TrajectoryConfig(max_row_tokens=512), engine, steps=2, groups_per_step=2, seed=0,
                           work_dir=tmp_path, epochs=2)


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    return {t: short_loop(tmp_path_factory.mktemp(f"t{t}"), t) for t in (1.0, 0.5)}


def test_engine_and_trainer_logprobs_agree_on_the_same_weights(loops):
    steps = loops[1.0].steps
    assert all(s.logprob_abs_diff_tokens == s.trained_tokens > 0 for s in steps)  # every token: same version
    assert all(s.logprob_abs_diff_max < 1e-3 for s in steps), [s.logprob_abs_diff_max for s in steps]


def test_a_tempered_engine_moves_the_metric(loops):
    same, tempered = loops[1.0].steps, loops[0.5].steps
    assert all(s.logprob_abs_diff_tokens > 0 for s in tempered)
    assert min(s.logprob_abs_diff_mean for s in tempered) > 100 * max(s.logprob_abs_diff_mean for s in same)
    assert min(s.logprob_abs_diff_mean for s in tempered) > 1e-2
