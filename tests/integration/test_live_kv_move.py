"""A live gyre run (mpirun, 1 + 3 ranks, local.yaml shortened) with engine.kv_cache and the default proxy.mover kv:
a rollout engine drained while it serves calls (what the allocator does at a switch; here an operator thread asks
the proxy, as test_live_faults kills an engine, because whether a switch finds calls in flight is up to timing)
moves their KV blocks to the engines that stay, and the run trains every step without losing a run."""
from pathlib import Path

import httpx
import pytest

from gyre_hpc.net import auth
from gyre_hpc.allocator.eventlog import read_events
from live_run import AGENT_TIMEOUT, RunWatcher, run_live
from slurm_cluster import mpirun  # noqa: F401  (fixture)

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

OVERRIDES = [
    "scheduler.policy=gyre", "cluster.cells=3", "scheduler.batch_groups=2", "allocator.steps=3",
    "agent.runs_per_group=4", "agent.turns=[2, 3]", AGENT_TIMEOUT, "run.name=kvmove-ci",
    "allocator.hello_timeout_s=300", "proxy.startup_timeout_s=300", "allocator.heartbeat_timeout_s=300",
    "engine.kv_block_size=4", "engine.device_tick_s=0.02",  # calls last long enough
    # engine.kv_cache and engine.sleep_in_training: configs/local.yaml's own (both on since issue 31)
]


class Drainer(RunWatcher):
    """Drains an engine with calls in flight while another serves, then adds it back; until a KV move is seen."""

    def __init__(self, out: Path, tries: int = 5):
        super().__init__(out)
        self.tries = tries
        self.drains: list[dict] = []

    def run(self) -> None:
        try:
            proxy = self._wait(self._proxy_url)
            secret = next(self.out.glob(f"*/{auth.SECRET_FILE}")).read_text()
            with httpx.Client(base_url=proxy, timeout=60.0, headers=auth.bearer(secret)) as http:
                for _ in range(self.tries):
                    eng = self._wait(lambda: self._busy(http), 0.01)
                    done = http.post("/admin/drain", json={"engine": eng["name"]}).json()
                    http.post("/admin/engines", json={"url": eng["url"], "cell": eng["cell"], "name": eng["name"]})
                    self.drains.append(done)
                    if http.get("/admin/stats").json().get("runs_moved_kv", 0) >= 1:
                        return
        except Exception as exc:  # reported by the test
            self.error = f"{type(exc).__name__}: {exc}"

    @staticmethod
    def _busy(http: httpx.Client) -> dict | None:
        active = [e for e in http.get("/admin/engines").json()["engines"] if e["state"] == "active"]
        busy = [e for e in active if e["in_flight"]]
        return busy[0] if busy and len(active) >= 2 else None


def test_a_live_run_moves_kv_blocks_when_an_engine_drains_and_loses_no_run(mpirun, tmp_path):
    drainer = Drainer(tmp_path)
    drainer.start()
    summary, run_dir, _ = run_live(tmp_path, OVERRIDES)
    drainer.join(5)
    assert drainer.drains, f"no engine was drained: {drainer.error}"
    assert summary["steps"] == 3 and summary["runs_lost"] == 0
    assert summary["runs_moved_kv"] >= 1, {k: summary.get(k) for k in ("runs_moved", "moves_by_kind")}
    assert summary["moves_by_kind"]["kv"] >= 1 and summary["kv_move_median_s"] > 0
    assert summary["runs_scored"] == summary["runs_finished"], summary["run_statuses"]
    kv = [e for e in read_events(run_dir / "proxy-events.jsonl") if e["event"] == "move" and e["kind"] == "kv"]
    assert kv and all(e["moved_tokens"] > 0 for e in kv)  # the rest of a prefix the source never computed (a
    # request cut while it queued) is re-prefilled: reprefill_tokens is not bounded by one block here
