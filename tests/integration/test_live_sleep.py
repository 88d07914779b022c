"""Engines that sleep through training (``engine.sleep_in_training``), through the real live runtime (mpirun,
1 + 3 ranks, colocate: every cell trains each batch and returns after the step).

Each cell starts its engine process once; a switch to training releases its memory
(``/release_memory_occupation``) instead of stopping it, and the switch back wakes it, loads the newest weights
and registers it again — so the N-th wake serves version N from its first token, no run is lost, and no
training→rollout switch starts a process.
"""
import json
import re

import pytest

from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.trajectory.records import read_tito
from live_run import run_live
from slurm_cluster import mpirun  # noqa: F401  (fixture)

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

OVERRIDES = [
    "cluster.cells=3", "scheduler.policy=colocate", "scheduler.batch_groups=2", "allocator.steps=3",
    "agent.runs_per_group=4", "agent.turns=[1, 2]", "agent.timeout_s=120", "run.name=sleep",
    "allocator.hello_timeout_s=300", "proxy.startup_timeout_s=300", "train.epochs=1",
    "engine.sleep_in_training=true",
]


@pytest.fixture(scope="module")
def sleep_run(mpirun, tmp_path_factory):
    return run_live(tmp_path_factory.mktemp("sleep"), OVERRIDES)


def test_every_cell_starts_one_engine_process_and_wakes_it_after_each_step(sleep_run):
    summary, run_dir, _ = sleep_run
    assert summary["steps"] == 3 and summary["runs_lost"] == 0
    cells = [json.loads(p.read_text()) for p in sorted((run_dir / "cells").glob("cell*.json"))]
    assert [c["engine_starts"] for c in cells] == [1, 1, 1]
    assert all(c["engine_wakes"] >= 2 for c in cells), [c["engine_wakes"] for c in cells]
    to_train = [s for c in cells for s in c["switches"] if s["to"] == "train"]
    to_rollout = [s for c in cells for s in c["switches"] if s["to"] == "rollout"]
    assert to_train and all("engine_sleep_s" in s and "engine_stop_s" not in s for s in to_train)
    assert to_rollout and all("engine_wake_s" in s and "engine_start_s" not in s for s in to_rollout)
    done = [e for e in read_events(run_dir / "events.jsonl") if e["event"] == "switch_done" and e["role"] == "rollout"]
    assert done and all("engine_wake_s" in e["timing"] for e in done)


def test_a_woken_engine_serves_the_newest_version(sleep_run):
    _, run_dir, _ = sleep_run
    calls = [c for f in sorted((run_dir / "tito").glob("*.jsonl")) for c in read_tito(f).calls]
    woken = [(int(m.group(1)), c) for c in calls
             if len(c.output_ids) and (m := re.fullmatch(r"cell\d+-e1w(\d+)", c.engine))]
    assert woken, "no call was served by a woken engine"
    # colocate: the N-th wake of every cell follows the N-th optimizer step. A call's last token comes from the
    # engine the call names (earlier ones may come from an engine it moved away from).
    for wake, call in woken:
        assert int(call.output_versions[-1]) >= wake, (call.engine, call.output_versions.tolist())
    assert max(int(c.output_versions[-1]) for _, c in woken) >= 2
