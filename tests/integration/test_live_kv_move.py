"""A live gyre run (mpirun, the default local.yaml shortened) with engine.kv_cache and the default proxy.mover kv:
cells leaving rollout move their unfinished runs' KV blocks to the engines that stay, and no run is lost."""
import pytest

from gyre_hpc.proxy.events import read_events
from live_run import run_live
from slurm_cluster import mpirun  # noqa: F401  (fixture)

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

OVERRIDES = [
    "scheduler.policy=gyre", "cluster.cells=3", "scheduler.batch_groups=2", "allocator.steps=3",
    "agent.runs_per_group=6", "agent.turns=[2, 3]", "agent.timeout_s=120", "run.name=kvmove-ci",
    "allocator.hello_timeout_s=300", "engine.kv_cache=true", "engine.kv_block_size=4",
]


def test_a_live_run_moves_kv_blocks_on_switches_and_loses_no_run(mpirun, tmp_path):
    summary, run_dir, _ = run_live(tmp_path, OVERRIDES)
    assert summary["steps"] == 3 and summary["runs_lost"] == 0
    assert summary["runs_moved_kv"] >= 1, {k: summary.get(k) for k in ("runs_moved", "moves_by_kind")}
    assert summary["moves_by_kind"]["kv"] >= 1 and summary["kv_move_median_s"] > 0
    events = read_events(run_dir / "proxy-events.jsonl")
    kv = [e for e in events if e["event"] == "move" and e["kind"] == "kv"]
    assert kv and all(e["moved_tokens"] > 0 and e["reprefill_tokens"] <= 4 for e in kv)
