"""The MLflow backend against a real ``mlflow server`` on loopback (started and stopped by PID here): MlflowClient
finds the run, its params and its metric history; a server that goes away mid-run and comes back loses no metric
(the sink's bounded buffer and retries), and the failure is a ``tracking_error`` record."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gyre_hpc.config import TrackingConfig
from gyre_hpc.tracking.sink import Tracker, read_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, root: Path):
        self.root, self.port, self.proc = root, _free_port(), None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--workers", "1", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               "--default-artifact-root", str(self.root / "artifacts")]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no huey job workers
        self.proc = subprocess.Popen(cmd, stdout=open(self.root / "server.log", "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError((self.root / "server.log").read_text()[-3000:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its worker, by the group of its PID
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("mlflow-server"))
    try:
        s.start()
        yield s
    finally:
        s.stop()


def _tracker(server, run_dir: Path) -> Tracker:
    cfg = TrackingConfig(backends=("mlflow",), mlflow_uri=server.url, retry_s=0.2, close_timeout_s=120.0)
    return Tracker(cfg, run_dir, params={"trajectory.j_max": 3, "scheduler.policy": "gyre"}, name="t",
                   tags={"policy": "gyre"})


def _history(server, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(server.url).get_metric_history(run_id, key))


def test_mlflow_server_holds_the_run_its_params_and_metric_history(server, tmp_path):
    from mlflow.tracking import MlflowClient

    t = _tracker(server, tmp_path)
    for s in (1, 2, 3):
        t.step({"step": s, "reward": s / 10, "staleness_max": s}, float(s))
    t.finish({"wall_s": 3.5}, 3)
    t.close()
    assert t.take_errors() == []
    run = MlflowClient(server.url).get_run(t.run_ids()["mlflow"])
    assert run.info.status == "FINISHED" and run.data.tags["policy"] == "gyre"
    assert run.data.params == {"trajectory.j_max": "3", "scheduler.policy": "gyre"}
    assert _history(server, run.info.run_id, "reward/mean") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert _history(server, run.info.run_id, "summary/wall_s") == [(3, 3.5)]


def test_a_server_that_goes_away_mid_run_loses_no_metric(server, tmp_path):
    t = _tracker(server, tmp_path)
    t.step({"step": 1, "reward": 0.1}, 1.0)
    deadline = time.monotonic() + 120
    while read_state(tmp_path / "tracking", "mlflow").get("upto") != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    server.stop()
    t0 = time.monotonic()
    for s in (2, 3, 4):
        t.step({"step": s, "reward": s / 10}, float(s))
    assert time.monotonic() - t0 < 0.5  # the caller never waits on the backend
    while not t.errors and time.monotonic() < deadline:
        time.sleep(0.2)
    server.start()
    t.close()
    errors = t.take_errors()
    assert errors and all(e["event"] == "tracking_error" and e["backend"] == "mlflow" for e in errors)
    assert _history(server, t.run_ids()["mlflow"], "reward/mean") == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
