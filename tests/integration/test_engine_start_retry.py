"""An engine killed while it starts (an operator's or the OOM killer's SIGKILL before ``/health`` answered) is
started again (``engines.launch.start_engine_on_free_port``, ``KILLED_STARTING``): the caller gets a ready engine
of another process, as for an engine that dies serving (issue 15: a dead engine is restarted). Found by
benchmarks/chaos_live.py: before, such a kill ended the cell's rank with an EngineError."""
from __future__ import annotations

import threading
import time

import psutil
import pytest

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.client import EngineClient
from gyre_hpc.engines.launch import start_engine_on_free_port

pytestmark = [pytest.mark.slow]


def engines_of_this_process() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "gyre_hpc.localengine.server" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


class KillFirstStart(threading.Thread):
    """SIGKILLs the first engine process that appears, while it is still starting (importing torch)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.killed: int | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while self.killed is None and time.monotonic() < deadline:
            for p in engines_of_this_process():
                p.kill()
                self.killed = p.pid
                return
            time.sleep(0.05)


def test_an_engine_killed_while_it_starts_is_started_again(tmp_path):
    killer = KillFirstStart()
    killer.start()
    handle = start_engine_on_free_port(EngineConfig(startup_timeout_s=600), ModelConfig(),
                                       log_path=tmp_path / "engine.log", name="cell1")
    try:
        killer.join(5)
        assert killer.killed is not None and handle.pid != killer.killed
        with EngineClient(handle.url) as client:
            assert client.health(timeout=30.0)
    finally:
        handle.stop()

