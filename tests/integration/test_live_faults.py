"""Failures in a live run: a rollout cell's engine is SIGKILLed while it serves runs (mpirun, 1 + 3 ranks).

The test watches the run from outside, as an operator would: it asks the proxy (``/admin/engines``) for an
engine with calls in flight while another engine serves, finds its PID in the engine's ready line
(``cells/cell<c>/engine-N.log``) and SIGKILLs it. The run must still train every step, lose no run, move the
dead engine's calls to other engines, log the death and the restart, and score every finished run.
"""
import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from gyre_hpc.net import auth
from gyre_hpc.allocator.eventlog import read_events
from live_run import AGENT_TIMEOUT, RunWatcher, run_live
from slurm_cluster import mpirun  # noqa: F401  (fixture)

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

OVERRIDES = [
    "cluster.cells=3", "scheduler.policy=colocate", "scheduler.batch_groups=2", "allocator.steps=2",
    "agent.runs_per_group=4", "agent.turns=[2, 3]", AGENT_TIMEOUT, "run.name=faults",
    # a loaded 2-core machine starts processes slowly; nothing here depends on a quick heartbeat timeout
    "allocator.hello_timeout_s=300", "proxy.startup_timeout_s=300", "allocator.heartbeat_timeout_s=300",
    "engine.kv_cache=false", "engine.sleep_in_training=false",  # as written (the configs: both on, issue 31)
]


class EngineKiller(RunWatcher):
    """Kills one engine that has calls in flight, as soon as another engine serves beside it."""

    def __init__(self, out: Path):
        super().__init__(out)
        self.killed: dict | None = None

    def run(self) -> None:
        try:
            proxy = self._wait(self._proxy_url)
            secret = next(self.out.glob(f"*/{auth.SECRET_FILE}")).read_text()  # the run's job secret
            with httpx.Client(base_url=proxy, timeout=5.0, headers=auth.bearer(secret)) as http:
                victim = self._wait(lambda: self._victim(self._engines(http)), 0.01)
                pid = self._pid(victim)
                os.kill(pid, signal.SIGKILL)
                self.killed = {**victim, "pid": pid, "t": time.time()}
        except Exception as exc:  # reported by the test
            self.error = f"{type(exc).__name__}: {exc}"

    @staticmethod
    def _victim(engines: list[dict]) -> dict | None:
        """An engine with calls in flight while another engine serves (its calls have somewhere to go)."""
        busy = [e for e in engines if e["in_flight"]]
        return busy[0] if busy and len(engines) >= 2 else None

    @staticmethod
    def _engines(http: httpx.Client) -> list[dict]:
        return [e for e in http.get("/admin/engines").json()["engines"] if e["state"] == "active"]

    def _pid(self, engine: dict) -> int:
        for log in self.out.glob(f"*/cells/cell{engine['cell']}/engine-*.log"):
            m = re.search(rf"gyre-engine ready url={re.escape(engine['url'])} pid=(\d+)", log.read_text(errors="replace"))
            if m:
                return int(m.group(1))
        raise LookupError(f"no ready line for {engine}")


@pytest.fixture(scope="module")
def killed_run(mpirun, tmp_path_factory):
    out = tmp_path_factory.mktemp("faults")
    killer = EngineKiller(out)
    killer.start()
    summary, run_dir, stderr = run_live(out, OVERRIDES)
    killer.join(5)
    assert killer.killed is not None, f"no engine was killed: {killer.error}"
    return summary, run_dir, killer.killed


def test_a_killed_engine_loses_no_run_and_the_run_trains_every_step(killed_run):
    summary, run_dir, _ = killed_run
    assert summary["steps"] == 2 and summary["stop"]["reason"] == "2 optimizer steps done"
    assert summary["stop"]["lost"] == [] and summary["stop"]["no_bye"] == []
    assert summary["runs_lost"] == 0 and summary["runs_moved"] >= 1
    assert summary["runs_scored"] == summary["runs_finished"] >= 2 * 2 * 4, summary["run_statuses"]


def test_the_dead_engines_calls_continue_on_other_engines(killed_run):
    _, run_dir, killed = killed_run
    proxy_events = [json.loads(line) for line in (run_dir / "proxy-events.jsonl").read_text().splitlines()]
    moves = [e for e in proxy_events if e["event"] == "move" and e["from_engine"] == killed["name"]]
    assert moves and all(m["reason"] == "dead" and m["to_engine"] != killed["name"] for m in moves)
    assert not [e for e in proxy_events if e["event"] == "call_lost"]


def test_the_event_log_has_the_death_then_the_restart_and_the_summary_counts_them(killed_run):
    summary, run_dir, killed = killed_run
    events = read_events(run_dir / "events.jsonl")
    died = [e for e in events if e["event"] == "engine_died"]
    back = [e for e in events if e["event"] == "engine_restarted"]
    assert [(d["cell"], d["pid"], d["exit_code"], d["engine"]) for d in died] == [
        (killed["cell"], killed["pid"], -signal.SIGKILL, killed["name"])]
    assert died[0]["calls_moved"] >= 1 and died[0]["runs_moved"] >= 1
    assert len(back) == 1 and back[0]["cell"] == killed["cell"] and back[0]["pid"] != killed["pid"]
    assert back[0]["t"] > died[0]["t"] and back[0]["start_s"] > 0 and back[0]["engine"] != killed["name"]
    assert (summary["engine_deaths"], summary["engine_restarts"]) == (1, 1)
    cell = json.loads((run_dir / "cells" / f"cell{killed['cell']}.json").read_text())
    assert [d["pid"] for d in cell["engine_deaths"]] == [killed["pid"]] and cell["failed"] == ""
