"""A rollout cell of two engine replicas against a real proxy and real local engines (no MPI): both register under
their own names, a replica killed by SIGKILL is reaped and restarted alone (its sibling keeps its process and keeps
serving), and leaving drains and stops both (live/rollout_side.py, live/engine_replica.py)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from gyre_hpc.config import EngineConfig, ModelConfig, ProxyConfig, TransferConfig
from gyre_hpc.engines.launch import on_free_port
from gyre_hpc.live.rollout_side import RolloutSide
from gyre_hpc.proxy.client import ProxyClient
from gyre_hpc.proxy.launch import start_proxy
from gyre_hpc.replicas import ReplicaSpec

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow]

ENGINE = EngineConfig(max_running_requests=8, context_len=256, request_timeout_s=120.0)


def _active(admin: ProxyClient) -> list[str]:
    return sorted(e["name"] for e in admin.engines() if e["state"] == "active")


def test_a_dead_replica_restarts_alone_and_leaving_drains_and_stops_both(tmp_path):
    (tmp_path / "cells" / "cell0").mkdir(parents=True)
    cfg = ProxyConfig(event_log=str(tmp_path / "events.jsonl"), no_engine_wait_s=3.0, request_timeout_s=120.0,
                      health_timeout_s=1.0, tito_dir=str(tmp_path / "tito"))
    proxy = on_free_port(start_proxy, cfg, log_path=tmp_path / "proxy.log")
    side = RolloutSide(tmp_path, 0, proxy.url, engine=ENGINE, model=ModelConfig(), transfer=TransferConfig(),
                       proxy=cfg, seed=0, replicas=[ReplicaSpec(0), ReplicaSpec(1)])
    try:
        with ProxyClient(proxy.url, timeout=120.0) as admin:
            assert "engine_start_s" in side.start()
            assert _active(admin) == ["cell0-r0-e1", "cell0-r1-e1"]
            urls = {r.handle.url for r in side.replicas}
            assert len(urls) == 2 and urls == {e["url"] for e in admin.engines()}  # a port each
            kept = side.replicas[0].handle.pid

            os.kill(side.replicas[1].handle.pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while not side.dead() and time.monotonic() < deadline:
                time.sleep(0.05)
            died = side.reap()
            assert died["engine"] == "cell0-r1-e1" and died["exit_code"] == -signal.SIGKILL
            assert side.deaths[-1]["replica"] == 1 and _active(admin) == ["cell0-r0-e1"]  # the sibling serves on

            side.start()  # only the dead replica: a new process under a fresh name
            assert side.replicas[0].handle.pid == kept and side.starts == 3
            assert _active(admin) == ["cell0-r0-e1", "cell0-r1-e2"]

            out = side.leave()
            assert "drain_s" in out and "engine_stop_s" in out
            assert admin.engines() == [] and not side.running and not side.dead()
    finally:
        side.close()
        proxy.stop()
