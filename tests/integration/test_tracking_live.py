"""Issue 29 in CI: ``gyre train configs/local.yaml --set allocator.steps=3 --set 'tracking.backends=[tensorboard,
mlflow, wandb]'`` (a real live run: mpirun, megatron core, local engines, proxy). Each store, read back with its own
library, holds the resolved config and exactly the 3 optimizer steps of metrics.jsonl, the PNGs and the summary."""
import json
from pathlib import Path

import pytest

from live_run import run_live
from slurm_cluster import mpirun  # noqa: F401  (fixture)
from wandb_files import read_run

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.slow, pytest.mark.timeout(1200)]

STEPS = 3


@pytest.fixture(scope="module")
def run(mpirun, tmp_path_factory):
    summary, run_dir, stderr = run_live(tmp_path_factory.mktemp("tracking"), [
        f"allocator.steps={STEPS}", "tracking.backends=[tensorboard, mlflow, wandb]", "run.name=tracked"],
        timeout_s=900)  # three backends start beside the run (W&B core, MLflow tables): generous on a loaded box
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    return summary, run_dir, steps, stderr


def test_tensorboard_holds_each_step_once_the_config_the_plots_and_the_summary(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary, run_dir, steps, _ = run
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("tokens/trained")] == \
        [(s["step"], float(s["trained_tokens"])) for s in steps]
    assert [e.step for e in acc.Scalars("staleness/max")] == [1, 2, 3]
    assert {"plots/roles", "plots/reward", "plots/staleness", "plots/query_durations"} <= set(acc.Tags()["images"])
    assert {"config", "summary"} <= set(acc.Tags()["tensors"])
    assert acc.Scalars("summary/wall_s")[0].value == pytest.approx(summary["wall_s"])


def test_mlflow_store_holds_the_run_its_params_and_the_metric_history(run):
    from mlflow.tracking import MlflowClient

    summary, run_dir, steps, _ = run
    run_id = json.loads((run_dir / "tracking" / "mlflow.json").read_text())["run_id"]
    client = MlflowClient(f"sqlite:///{run_dir / 'mlruns' / 'mlflow.db'}")
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == run_dir.name
    assert got.data.params["allocator.steps"] == str(STEPS) and got.data.params["scheduler.policy"] == "gyre"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "tokens/trained"))
    assert history == [(s["step"], float(s["trained_tokens"])) for s in steps]
    assert {"role_share/rollout", "staleness/mean"} <= set(got.data.metrics)
    assert {a.path for a in client.list_artifacts(run_id)} >= {"summary.json", "plots"}


def test_wandb_offline_run_holds_the_config_and_the_step_history(run):
    summary, run_dir, steps, _ = run
    run_id = json.loads((run_dir / "tracking" / "wandb.json").read_text())["run_id"]
    path = sorted(Path(run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))[0]  # the run's own
    w = read_run(path)
    assert w["run_id"] == run_id
    assert w["config"]["allocator.steps"] == STEPS and w["config"]["scheduler.policy"] == "gyre"
    rows = [h for h in w["history"] if "tokens/trained" in h]
    assert [(h["_step"], h["tokens/trained"]) for h in rows] == [(s["step"], s["trained_tokens"]) for s in steps]
    assert w["summary"]["wall_s"] == pytest.approx(summary["wall_s"])


def test_tracking_took_no_failure(run):
    _, run_dir, _, stderr = run
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e for e in events if e["event"] == "tracking_error"] == [] and "gyre tracking" not in stderr


def test_simulate_trace_track_logs_the_replay_to_the_same_runs(run):
    """``gyre simulate --trace RUN_DIR --track``: the replay's numbers and its predicted-vs-measured plot reach the
    run's own TensorBoard directory, MLflow run and W&B run id."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gyre_hpc.cli import main

    _, run_dir, _, _ = run
    assert main(["simulate", "--trace", str(run_dir), "--track", "--json"]) == 0
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    assert "plots/replay_roles" in acc.Tags()["images"] and "replay/measured/wall_s" in acc.Tags()["scalars"]
    run_id = json.loads((run_dir / "tracking" / "mlflow.json").read_text())["run_id"]
    assert "replay/measured/wall_s" in MlflowClient(f"sqlite:///{run_dir / 'mlruns' / 'mlflow.db'}").get_run(
        run_id).data.metrics
    wid = json.loads((run_dir / "tracking" / "wandb.json").read_text())["run_id"]
    runs = [read_run(p) for p in sorted(Path(run_dir / "wandb").glob(f"offline-run-*-{wid}/run-{wid}.wandb"))]
    assert len(runs) == 2 and any("replay/measured/wall_s" in h for h in runs[1]["history"])
