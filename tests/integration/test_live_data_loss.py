"""Lost training data stops a live run (issue 15 item 6, issue 16): the real runtime (mpirun, 1 + 2 ranks),
with ``trajectory.max_row_tokens=2`` so that no group can be packed (every group is lost, deterministically)
and ``allocator.max_lost_group_share=0`` (the first lost group is too many)."""
import json

import pytest

from gyre_hpc.allocator.eventlog import read_events
from live_run import AGENT_TIMEOUT, run_live
from slurm_cluster import mpirun  # noqa: F401  (fixture)

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

OVERRIDES = [
    "cluster.cells=2", "scheduler.policy=colocate", "scheduler.batch_groups=2", "allocator.steps=2",
    "agent.runs_per_group=4", "agent.turns=[1, 2]", AGENT_TIMEOUT, "run.name=dataloss",
    "allocator.hello_timeout_s=300", "proxy.startup_timeout_s=300", "train.epochs=1",
    "trajectory.max_row_tokens=2", "allocator.max_lost_group_share=0",
    "engine.sleep_in_training=true",  # no engine restart per switch (CPU); restarts: test_live_training
]


def test_a_lost_group_is_counted_logged_warned_about_and_above_the_share_stops_the_run_with_an_error(
        mpirun, tmp_path):
    summary, run_dir, stderr = run_live(tmp_path, OVERRIDES, returncode=2)
    assert summary["groups_lost"] >= 1 and summary["runs_scored"] == 0
    assert summary["runs_lost"] == sum(g["runs"] for g in summary["lost_groups"])  # every run was scored
    assert summary["error"].startswith("data loss: ") and summary["stop"]["reason"] == f"error: {summary['error']}"
    assert summary == json.loads((run_dir / "summary.json").read_text())
    events = read_events(run_dir / "events.jsonl")
    lost = [e for e in events if e["event"] == "group_lost"]
    assert [e["gid"] for e in lost] == [g["gid"] for g in summary["lost_groups"]]
    assert all("max_row_tokens" in e["reason"] or "longer than" in e["reason"] for e in lost), lost[0]
    assert [e["error"] for e in events if e["event"] == "error"] == [summary["error"]]
    lines = stderr.strip().splitlines()
    assert any(line.startswith(f"gyre train: warning: {summary['groups_lost']} group(s) lost") for line in lines)
    assert lines[-1].startswith("gyre train: error: data loss: ")
