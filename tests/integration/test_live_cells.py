"""A live run whose cells are groups of workers (configs/local_cells.yaml: 2 cells x 2 emulated nodes x 2 workers):
the core trains with TP 2 x DP 2 over its four workers, every worker of the allocation trained or served, and the
run switches both ways without losing a run."""
import json

import pytest

from live_run import run_live

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(1500)]


def test_every_worker_of_a_cells_run_trains_or_serves_and_the_core_steps_under_tp2_x_dp2(tmp_path):
    summary, run_dir, _ = run_live(tmp_path, ["allocator.steps=2", "run.name=cells"], config="local_cells.yaml",
                                   timeout_s=1200)
    assert summary["steps"] >= 2 and summary["runs_lost"] == 0 and summary["groups_lost"] == 0
    assert summary["switches_r2t"] >= 1 and summary["switches_t2r"] >= 1
    assert summary["parallel"] == {"tp": 2, "pp": 1, "dp": 2}
    assert summary["workers"] == 8  # 2 cells x 4 workers: each trained or served (the allocator is not a worker)
    cells = [json.loads((run_dir / "cells" / f"cell{c}.json").read_text()) for c in (0, 1)]
    core = cells[0]
    assert core["core"] and core["workers"] == 4 and core["workers_trained"] == 4
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(s["parallel"] == {"tp": 2, "pp": 1, "dp": 2} for s in steps)
    # the engines serve what the TP 2 trainer exported: train-inference agreement at float-rounding level
    assert summary["logprob_abs_diff_max"] is not None and summary["logprob_abs_diff_max"] < 1e-4
