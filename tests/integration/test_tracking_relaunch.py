"""A relaunch that trains steps again (rank 0 died after its last resume save): TensorBoard, read back with its own
EventAccumulator, holds every step once, the steps trained again with the values of the segment that kept them;
a backend that cannot purge is held at the last saved step, so it never takes a step that will be trained again."""
import json

import pytest

from gyre_hpc.config import TrackingConfig
from gyre_hpc.tracking.sink import Tracker, read_state

pytestmark = [pytest.mark.slow]


def rec(step: int, tokens: int) -> dict:
    return {"step": step, "trained_tokens": tokens}


def test_tensorboard_purges_the_steps_a_relaunch_trains_again(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = TrackingConfig(backends=("tensorboard",))
    first = Tracker(cfg, tmp_path, params={"a": 1}, name="r")
    for s in range(1, 6):
        first.step(rec(s, 100 + s), float(s))
    first.close(finished=False)  # rank 0 died after step 5; its last resume state holds steps 1..3
    assert read_state(tmp_path / "tracking", "tensorboard")["upto"] == 5
    kept = [rec(s, 100 + s) for s in (1, 2, 3)]
    second = Tracker(cfg, tmp_path, params={"a": 1}, name="r", kept=kept)
    for s in (4, 5, 6):
        second.step(rec(s, 200 + s), float(s))
    second.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("tokens/trained")] == \
        [(1, 101.0), (2, 102.0), (3, 103.0), (4, 204.0), (5, 205.0), (6, 206.0)]
    assert second.take_errors() == []


def test_a_backend_that_cannot_purge_takes_a_step_once_a_resume_state_holds_it(tmp_path):
    """MLflow on a local store: with periodic resume saves, step 3 waits until ``kept(3)``."""
    import time

    cfg = TrackingConfig(backends=("mlflow",), close_timeout_s=300)
    t = Tracker(cfg, tmp_path, params={"a": 1}, name="r", kept=None, hold_steps=True)
    t.step(rec(1, 101), 1.0)
    t.kept(1)
    t.step(rec(2, 102), 2.0)
    deadline = time.monotonic() + 300
    while read_state(tmp_path / "tracking", "mlflow").get("upto") != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    assert read_state(tmp_path / "tracking", "mlflow")["upto"] == 1  # step 2 is not in a resume state yet
    t.close(finished=False, timeout=2.0)  # rank 0 "dies": step 2 was never sent
    state = json.loads((tmp_path / "tracking" / "mlflow.json").read_text())
    assert state["upto"] == 1
    again = Tracker(cfg, tmp_path, params={"a": 1}, name="r", kept=[rec(1, 101)], hold_steps=True)
    again.step(rec(2, 302), 2.0)
    again.kept(None)
    again.close()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    assert sorted((m.step, m.value) for m in client.get_metric_history(state["run_id"], "tokens/trained")) == \
        [(1, 101.0), (2, 302.0)]


def test_a_local_mlflow_store_keeps_its_artifacts_in_the_run_directory(tmp_path, monkeypatch):
    """The sqlite store's default artifact root would be ./mlruns of the working directory: ours is RUN_DIR/mlruns."""
    from mlflow.tracking import MlflowClient

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    run_dir = tmp_path / "run"
    png = tmp_path / "p.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(16))
    t = Tracker(TrackingConfig(backends=("mlflow",), close_timeout_s=300), run_dir, params={}, name="r")
    t.finish({"wall_s": 1.0}, 1, [png])
    t.close()
    assert t.take_errors() == [] and not (cwd / "mlruns").exists()
    run_id = t.run_ids()["mlflow"]
    client = MlflowClient(f"sqlite:///{run_dir / 'mlruns' / 'mlflow.db'}")
    assert client.get_run(run_id).info.artifact_uri.startswith((run_dir / "mlruns" / "artifacts").as_uri())
    assert list((run_dir / "mlruns" / "artifacts").rglob("p.png")) and list((run_dir / "mlruns").rglob("summary.json"))
