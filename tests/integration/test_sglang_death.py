"""An SGLang server that dies mid-run (``gyre train configs/local_sglang.yaml``, mpirun 1 + 3 ranks, real SGLang).

The test watches the run from outside, as an operator would: it asks the proxy (``/admin/engines``) for the
satellite cell's engine (cell 1; the core's own cell must keep serving) while it has calls in flight and the core's
engine serves beside it, finds the server's PID in its log (uvicorn's ``Started server process [PID]``, checked
against the process's command line and port), notes the server's children (SGLang's scheduler and detokenizer)
and SIGKILLs the server by that PID. The config does not restart a dead server (``engine.max_restarts: 0``), so:
the run still trains every step and loses no run, the proxy moves the dead server's calls to the other engine
(``move`` with reason ``dead``), ``events.jsonl`` has the death and then the cell LOST (``CellFailed``), and
none of the server's children outlives it.
"""
import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from gyre_hpc.net import auth
from gyre_hpc.allocator.eventlog import read_events
from live_run import RunWatcher, run_live
from slurm_cluster import mpirun  # noqa: F401  (fixture)

#: as test_sglang_live.py: an SGLang cold start is ~20 s on 2 idle cores and minutes on the shared ones under load
TIMEOUT_S = 1500
VICTIM_CELL = 1  # not the core (cell 0): the core's engine serves the moved calls, and it trains the steps

pytestmark = [pytest.mark.sglang, pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow,
              pytest.mark.timeout(TIMEOUT_S + 120)]


class ServerKiller(RunWatcher):
    """SIGKILLs cell 1's SGLang server by PID once it has calls in flight while another engine serves."""

    def __init__(self, out: Path, timeout_s: float = TIMEOUT_S):
        super().__init__(out, timeout_s)
        self.killed: dict | None = None

    def run(self) -> None:
        try:
            proxy = self._wait(self._proxy_url, retry_on=(httpx.HTTPError,))
            secret = self._wait(lambda: next((p.read_text() for p in self.out.glob(f"*/{auth.SECRET_FILE}")), None))
            with httpx.Client(base_url=proxy, timeout=5.0, headers=auth.bearer(secret)) as http:
                victim = self._wait(lambda: self._victim(self._engines(http)), 0.01, retry_on=(httpx.HTTPError,))
                server = self._server(victim)
                children = [(c.pid, c.create_time()) for c in server.children(recursive=True)]
                os.kill(server.pid, signal.SIGKILL)
                self.killed = {**victim, "pid": server.pid, "children": children, "t": time.time()}
        except Exception as exc:  # reported by the test
            self.error = f"{type(exc).__name__}: {exc}"

    @staticmethod
    def _victim(engines: list[dict]) -> dict | None:
        """Cell 1's engine with calls in flight while another engine serves (its calls have somewhere to go)."""
        mine = [e for e in engines if e["cell"] == VICTIM_CELL and e["in_flight"]]
        return mine[0] if mine and len(engines) >= 2 else None

    @staticmethod
    def _engines(http: httpx.Client) -> list[dict]:
        return [e for e in http.get("/admin/engines").json()["engines"] if e["state"] == "active"]

    def _server(self, engine: dict) -> psutil.Process:
        """The ``sglang.launch_server`` process serving ``engine['url']``: the PID its log gave, checked."""
        port = engine["url"].rsplit(":", 1)[1]
        for log in sorted(self.out.glob(f"*/cells/cell{engine['cell']}/engine-*.log")):
            for pid in re.findall(r"Started server process \[(\d+)\]", log.read_text(errors="replace")):
                try:
                    proc = psutil.Process(int(pid))
                    cmd = proc.cmdline()
                except psutil.NoSuchProcess:
                    continue
                if "sglang.launch_server" in cmd and cmd[cmd.index("--port") + 1] == port:
                    return proc
        raise LookupError(f"no live sglang.launch_server found for {engine}")


@pytest.fixture(scope="module")
def killed_run(mpirun, tmp_path_factory):
    out = tmp_path_factory.mktemp("sglang_death")
    killer = ServerKiller(out)
    killer.start()
    summary, run_dir, _ = run_live(out, ["allocator.hello_timeout_s=300", "engine.max_restarts=0"],
                                   config="local_sglang.yaml", timeout_s=TIMEOUT_S)
    killer.join(5)
    assert killer.killed is not None, f"no server was killed: {killer.error}"
    return summary, run_dir, killer.killed


def test_the_run_trains_every_step_and_loses_no_run_after_a_server_died(killed_run):
    summary, _, _ = killed_run
    assert summary["engine_kind"] == "sglang"
    assert summary["steps"] == 2 and summary["stop"]["reason"] == "2 optimizer steps done"
    assert summary["runs_lost"] == 0 and summary["groups_lost"] == 0 and summary["runs_moved"] >= 1
    assert summary["run_statuses"].get("scored") == summary["runs_scored"] >= 2 * 2 * 4


def test_the_dead_servers_calls_move_to_the_other_engine(killed_run):
    _, run_dir, killed = killed_run
    proxy_events = [json.loads(line) for line in (run_dir / "proxy-events.jsonl").read_text().splitlines()]
    moves = [e for e in proxy_events if e["event"] == "move" and e["from_engine"] == killed["name"]]
    assert moves and all(m["reason"] == "dead" and m["to_engine"] != killed["name"] for m in moves)
    assert not [e for e in proxy_events if e["event"] == "call_lost"]


def test_the_event_log_has_the_death_then_the_cell_lost_and_no_restart(killed_run):
    summary, run_dir, killed = killed_run
    events = read_events(run_dir / "events.jsonl")
    died = [e for e in events if e["event"] == "engine_died"]
    assert [(d["cell"], d["pid"], d["exit_code"], d["engine"]) for d in died] == [
        (VICTIM_CELL, killed["pid"], -signal.SIGKILL, killed["name"])]
    assert died[0]["calls_moved"] >= 1
    lost = [e for e in events if e["event"] == "lost"]
    assert [(e["cell"], e["reason"]) for e in lost] == [
        (VICTIM_CELL, "failed: engine died 1 times (engine.max_restarts=0)")]
    assert lost[0]["t"] >= died[0]["t"]
    assert not [e for e in events if e["event"] == "engine_restarted"]
    assert (summary["engine_deaths"], summary["engine_restarts"]) == (1, 0)
    assert VICTIM_CELL in summary["stop"]["lost"]
    assert f"cell{VICTIM_CELL}" not in summary["engine_weight_versions"]  # no server at the end
    cell = json.loads((run_dir / "cells" / f"cell{VICTIM_CELL}.json").read_text())
    assert [d["pid"] for d in cell["engine_deaths"]] == [killed["pid"]] and cell["failed"].startswith("engine died")


def test_no_child_of_the_killed_server_outlives_it(killed_run):
    _, _, killed = killed_run
    assert killed["children"]  # SGLang's scheduler and detokenizer
    alive = []
    for pid, created in killed["children"]:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append((pid, proc.cmdline()))
        except psutil.NoSuchProcess:
            pass
    assert alive == []
