"""Issue 29: a ``gyre sweep --simulate`` of 4 grid points is 4 grouped tracked runs, read back with each backend's
own reader: TensorBoard subdirectories of one log directory, one W&B group, MLflow children of the sweep's parent."""
import csv
import json

import pytest

from gyre_hpc.cli import main
from slurm_cluster import ROOT
from wandb_files import read_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SMALL = str(ROOT / "configs" / "sim" / "small.yaml")


def test_a_simulate_sweep_of_four_points_is_four_grouped_runs(tmp_path, capsys):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "sw"
    code = main(["sweep", SMALL, "--simulate", "--executor", "local", "--set", "sim.steps=4",
                 "--set", "tracking.backends=[tensorboard, mlflow, wandb]",
                 "--grid", "scheduler.staleness_target=1,2", "--grid", "sim.steps=3,4", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader((out / "results.csv").open()))
    names = [f"e{i:03d}" for i in range(4)]
    for name, row in zip(names, rows):
        acc = EventAccumulator(str(out / "tensorboard" / name), size_guidance={"scalars": 0})
        acc.Reload()
        assert acc.Scalars("summary/gyre_hours")[0].value == pytest.approx(float(row["gyre_hours"]))
    client = MlflowClient(f"sqlite:///{out / 'mlruns' / 'mlflow.db'}")
    parent = json.loads((out / "tracking" / "parent" / "mlflow.json").read_text())["run_id"]
    children = [client.get_run(json.loads((out / "tracking" / n / "mlflow.json").read_text())["run_id"]) for n in names]
    assert all(c.data.tags["mlflow.parentRunId"] == parent for c in children)
    assert [(c.data.params["scheduler.staleness_target"], c.data.params["sim.steps"]) for c in children] == \
        [(r["scheduler.staleness_target"], r["sim.steps"]) for r in rows]
    runs = [read_run(p) for p in sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))]
    assert len(runs) == 4 and {r["group"] for r in runs} == {"sw"}
    assert sorted(r["config"]["scheduler.staleness_target"] for r in runs) == ["1", "1", "2", "2"]
