"""The agent task is learnable: a short closed RL loop (real engine, harness, pipeline, megatron Trainer, weight
updates) raises the reward of a randomly initialised tiny model on held-out queries.

The comparison is paired: the same held-out queries with the same sampling seeds, before training and after.
The longer curve is benchmarks/bench_learning.py (benchmarks/results/agents.md).
"""
import numpy as np
import pytest

from gyre_hpc.config import AgentConfig, EngineConfig, ModelConfig, TrainConfig, TrajectoryConfig

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow]

AGENT = AgentConfig(runs_per_group=8, turns=(1, 3), call_tokens=4, answer_tokens=8, tool_output_tokens=(1, 4),
                    context_budget=40, tool_time_median_s=0.01, timeout_s=60.0)
STEPS, GROUPS, EVAL_GROUPS = 16, 8, 32


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from gyre_hpc.agents.closed_loop import run_closed_loop

    engine = EngineConfig(max_running_requests=GROUPS * AGENT.runs_per_group, context_len=256,
                          request_timeout_s=120.0)
    work = tmp_path_factory.mktemp("loop")
    result = run_closed_loop(AGENT, ModelConfig(), TrainConfig(lr=1e-2, loss="ppo", threads=1),
                             TrajectoryConfig(max_row_tokens=512), engine, steps=STEPS, groups_per_step=GROUPS,
                             seed=0, work_dir=work, epochs=4, eval_groups=EVAL_GROUPS)
    return result, work


def test_held_out_reward_rises_clearly_after_a_short_rl_loop(loop):
    loop, _ = loop
    pairs = np.array([(b, a) for b, a in zip(loop.eval_before, loop.eval_after) if b is not None and a is not None])
    assert len(pairs) == EVAL_GROUPS * AGENT.runs_per_group
    gain = pairs[:, 1] - pairs[:, 0]
    se = gain.std(ddof=1) / np.sqrt(len(gain))
    assert gain.mean() > 0.05 and gain.mean() > 3 * se, (pairs.mean(axis=0), se)  # one-sided p < 0.002


def test_every_step_trained_on_branching_runs_and_moved_the_engine_to_the_new_version(loop):
    loop, _ = loop
    assert [r.version for r in loop.steps] == [4 * k for k in range(STEPS)]  # 4 optimizer steps per batch
    assert [r.generated_versions for r in loop.steps] == [(4 * k,) for k in range(STEPS)]  # the engine followed
    assert all(r.scored_runs == r.runs == GROUPS * AGENT.runs_per_group and r.trained_tokens > 0 for r in loop.steps)
    kinds = {k for r in loop.steps for k, n in r.branches.items() if n}
    assert kinds == {"root", "continuation", "retry", "compression", "subagent"}


def test_steps_never_repeat_a_query_and_never_train_on_evaluation_queries(loop):
    _, work = loop
    queries = {d.name: {f.name.split("-")[0] for f in d.glob("*.jsonl")} for d in (work / "tito").iterdir()}
    assert set(queries) == {f"step{k:03d}" for k in range(STEPS)} | {"eval-before", "eval-after"}
    trained = [q for name, qs in queries.items() if name.startswith("step") for q in qs]
    assert len(trained) == len(set(trained)) == STEPS * GROUPS
    assert queries["eval-before"] == queries["eval-after"] and not queries["eval-before"] & set(trained)
