"""The three tracking backends (edge): TensorBoard, Weights & Biases, MLflow, each imported lazily.

Every backend has the same five calls, made by one worker thread (gyre_hpc.tracking.sink), never concurrently:
``open(state)`` (state: what an earlier segment persisted, e.g. the run id; returns what to persist now),
``params(d)``, ``metrics(step, d)``, ``image(name, path, step)``, ``summary(d)``, ``close(finished)``.
A call that raises leaves the backend usable: the sink retries the same call later.

Where each one writes (docs/runtime.md):
- tensorboard: ``LOGDIR`` (RUN_DIR/tensorboard); a relaunch that trains steps again opens the writer with
  ``purge_step`` so readers drop the earlier segment's copies of those steps.
- wandb: ``RUN_DIR/wandb/offline-run-*`` (WANDB_MODE, default offline; WANDB_PROJECT, WANDB_ENTITY honoured);
  the same run id in every segment (``resume="allow"``).
- mlflow: ``tracking.mlflow_uri`` or ``sqlite:///RUN_DIR/mlruns/mlflow.db`` with artifacts in RUN_DIR/mlruns/artifacts
  (MLflow 3's file store is frozen);
  one experiment per project, the same run id in every
  segment; a sweep's points are children of the sweep's parent run (tag ``mlflow.parentRunId``).
"""
from __future__ import annotations

import os
from gyre_hpc.clock import WallClock
import uuid
from pathlib import Path
from typing import Any


_CLOCK = WallClock()  # wall stamps and deadlines through the one clock (gyre_hpc/clock.py)

class TensorBoard:
    name = "tensorboard"
    purges = True

    def __init__(self, logdir: Path, purge_from: int | None = None) -> None:
        self.logdir, self.purge_from, self.w = Path(logdir), purge_from, None

    def open(self, state: dict) -> dict:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir.mkdir(parents=True, exist_ok=True)
        self.w = EventFileWriter(str(self.logdir), flush_secs=10)
        if self.purge_from is not None:  # readers (EventAccumulator) drop every earlier event at >= this step
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog

            self.w.add_event(Event(step=self.purge_from, wall_time=_CLOCK.wall(),
                                   session_log=SessionLog(status=SessionLog.START)))
            self.purge_from = None
        return {}

    def _scalar_event(self, step: int, d: dict):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        return Event(step=step, wall_time=_CLOCK.wall(),
                     summary=Summary(value=[Summary.Value(tag=k, simple_value=float(v)) for k, v in d.items()]))

    def params(self, d: dict) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.plugins.text.summary_v2 import text_pb

        text = "\n".join(f"    {k}: {v}" for k, v in d.items())
        self.w.add_event(Event(step=0, wall_time=_CLOCK.wall(), summary=text_pb("config", text)))
        self.w.flush()

    def metrics(self, step: int, d: dict) -> None:
        self.w.add_event(self._scalar_event(step, d))
        self.w.flush()

    def image(self, name: str, path: Path, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        data = Path(path).read_bytes()
        w, h = _png_size(data)
        img = Summary.Image(encoded_image_string=data, height=h, width=w, colorspace=4)
        self.w.add_event(Event(step=step, wall_time=_CLOCK.wall(),
                               summary=Summary(value=[Summary.Value(tag=f"plots/{name}", image=img)])))
        self.w.flush()

    def summary(self, d: dict) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.compat.proto.event_pb2 import Event
        import json

        self.w.add_event(Event(step=0, wall_time=_CLOCK.wall(), summary=text_pb("summary", json.dumps(d, indent=1))))
        self.w.flush()

    def close(self, finished: bool) -> None:
        if self.w is not None:
            self.w.close()
            self.w = None


class Wandb:
    name = "wandb"
    purges = False

    def __init__(self, run_dir: Path, project: str, name: str, group: str | None = None,
                 tags: dict | None = None) -> None:
        self.run_dir, self.project, self.run_name, self.group, self.tags = Path(run_dir), project, name, group, tags
        self.run = None

    def open(self, state: dict) -> dict:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        run_id = state.get("run_id") or uuid.uuid4().hex[:8]
        (self.run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, init_timeout=120)
        self.run = wandb.init(id=run_id, resume="allow", dir=str(self.run_dir),
                              mode=os.environ.get("WANDB_MODE", "offline"),
                              project=os.environ.get("WANDB_PROJECT", self.project),
                              entity=os.environ.get("WANDB_ENTITY"), name=self.run_name, group=self.group,
                              tags=[f"{k}={v}" for k, v in (self.tags or {}).items()][:64], settings=settings,
                              reinit="create_new")
        return {"run_id": run_id}

    def params(self, d: dict) -> None:
        self.run.config.update(d, allow_val_change=True)

    def metrics(self, step: int, d: dict) -> None:
        self.run.log(d, step=step)

    def image(self, name: str, path: Path, step: int) -> None:
        import wandb

        self.run.log({f"plots/{name}": wandb.Image(str(path))}, step=step)

    def summary(self, d: dict) -> None:
        self.run.summary.update(d)

    def close(self, finished: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if finished else 1)
            self.run = None


class Mlflow:
    name = "mlflow"
    purges = False

    def __init__(self, uri: str, experiment: str, name: str, tags: dict | None = None,
                 parent: str | None = None, artifacts: Path | None = None) -> None:
        self.uri, self.experiment, self.run_name, self.tags, self.parent = uri, experiment, name, tags or {}, parent
        self.artifacts = artifacts  # a local store's artifact root (else MLflow's default: ./mlruns of the CWD)
        self.client, self.run_id = None, None

    def open(self, state: dict) -> dict:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the sink retries (bounded buffer, back-off)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        self.run_id = state.get("run_id")
        if self.run_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(
                self.experiment, artifact_location=self.artifacts.resolve().as_uri() if self.artifacts else None)
            tags = {**{k: str(v) for k, v in self.tags.items()}, "mlflow.runName": self.run_name}
            if self.parent:
                tags["mlflow.parentRunId"] = self.parent
            self.run_id = self.client.create_run(exp_id, tags=tags, run_name=self.run_name).info.run_id
        else:
            self.client.update_run(self.run_id, status="RUNNING")
        return {"run_id": self.run_id}

    def params(self, d: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in d.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100], synchronous=True)

    def metrics(self, step: int, d: dict) -> None:
        from mlflow.entities import Metric

        ts = int(_CLOCK.wall() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), ts, step) for k, v in d.items()],
                              synchronous=True)

    def image(self, name: str, path: Path, step: int) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path=f"plots/step{step:06d}")

    def summary(self, d: dict) -> None:
        import json
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp, "summary.json")
            p.write_text(json.dumps(d, indent=1, default=str))
            self.client.log_artifact(self.run_id, str(p))

    def close(self, finished: bool) -> None:
        if self.client is not None and finished:
            self.client.set_terminated(self.run_id, status="FINISHED")


def _png_size(data: bytes) -> tuple[int, int]:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return 0, 0


def make(kind: str, run_dir: Path, *, project: str, name: str, mlflow_uri: str | None, group: str | None = None,
         tags: dict | None = None, parent: str | None = None, tb_dir: Path | None = None,
         purge_from: int | None = None) -> Any:
    """One backend by its config name (``tracking.backends``)."""
    if kind == "tensorboard":
        return TensorBoard(tb_dir or Path(run_dir) / "tensorboard", purge_from)
    if kind == "wandb":
        return Wandb(run_dir, project, name, group, tags)
    if kind == "mlflow":
        if mlflow_uri is None:
            (Path(run_dir) / "mlruns").mkdir(parents=True, exist_ok=True)
        uri = mlflow_uri or f"sqlite:///{(Path(run_dir) / 'mlruns' / 'mlflow.db').resolve()}"
        return Mlflow(uri, project, name, tags, parent, None if mlflow_uri else Path(run_dir) / "mlruns" / "artifacts")
    raise ValueError(kind)
