"""A short live run of the tiny Qwen3-MoE model through the real runtime (``gyre train`` launches mpirun): the run
writes RUN_DIR/model/init as a Qwen3MoeForCausalLM directory, the local engines serve it, the megatron trainer trains
it (4 experts, top-2) for 2 steps while cells switch both ways, and no run is lost. Each cell has 2 workers: a
training cell is one expert-parallel group of 2 (``train.expert_parallel=2``: each worker holds 2 of the 4
experts), a rollout cell serves 2 engine replicas."""
import json

import pytest

from gyre_hpc.allocator.eventlog import read_events
from live_run import AGENT_TIMEOUT, run_live
from slurm_cluster import mpirun  # noqa: F401  (fixture)

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

MOE = ["model.experts=4", "model.experts_topk=2", "model.moe_ffn=32", "cluster.workers_per_node=2",
       "train.expert_parallel=2"]
OVERRIDES = MOE + [
    "cluster.cells=2", "scheduler.policy=colocate", "scheduler.batch_groups=2", "allocator.steps=2",
    "scheduler.mu=1", "agent.runs_per_group=2", "agent.turns=[1, 2]", AGENT_TIMEOUT, "run.name=moe",
    "allocator.hello_timeout_s=300", "proxy.startup_timeout_s=300", "train.epochs=1",
    "proxy.no_engine_wait_s=300",  # colocate trains on every cell: calls wait out engine restarts under load
]


@pytest.fixture(scope="module")
def live_run(mpirun, tmp_path_factory):
    return run_live(tmp_path_factory.mktemp("live-moe"), OVERRIDES)


def test_the_moe_model_trains_two_steps_switching_both_ways_without_losing_a_run(live_run):
    summary, run_dir, _ = live_run
    hf = json.loads((run_dir / "model" / "init" / "config.json").read_text())
    assert hf["architectures"] == ["Qwen3MoeForCausalLM"] and hf["num_experts_per_tok"] == 2
    assert summary["steps"] == 2 and summary["stop"]["reason"] == "2 optimizer steps done"
    assert summary["stop"]["lost"] == [] and summary["runs_lost"] == 0
    assert summary["workers"] == 4  # both workers of both cells trained or served
    assert summary["parallel"] == {"tp": 1, "pp": 1, "dp": 2, "ep": 2}  # the training cell: one EP group of 2
    assert summary["switches_r2t"] >= 1 and summary["switches_t2r"] >= 1
    assert [e["event"] for e in read_events(run_dir / "events.jsonl")].count("switch_done") >= 2
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["version"] for s in steps] == [1, 2]
    # the engine (megatron, same float32 weights) routes every token as the trainer does: logprobs agree
    first = steps[0]
    assert first["logprob_abs_diff_tokens"] == first["trained_tokens"] > 0
    assert first["logprob_abs_diff_max"] < 1e-3
