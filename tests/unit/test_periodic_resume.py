"""gyre_hpc.live.periodic: rank 0 writes RUN_DIR/resume every ``run.resume_every_steps`` steps, so that a run whose
rank 0 dies can be relaunched. The real allocator server (in-process transport), the real hub and the real rollout
driver (its harness never runs: no proxy) hold the run's state; the checkpoint files are written by hand."""
import json
import os

import pytest

from gyre_hpc.lifecycle import resume
from gyre_hpc.allocator.eventlog import EventLog
from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.server import AllocatorServer
from gyre_hpc.allocator.transport import InProcessWorld
from gyre_hpc.allocator.types import Role
from gyre_hpc.clock import ManualClock
from gyre_hpc.config import GyreConfig, load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.live import dataplane as dp
from gyre_hpc.live import lost, periodic
from gyre_hpc.live.hub import Hub
from gyre_hpc.live.rollouts import Rollouts, set_aside_from
from test_lost_rank_state import steps, write_latest


@pytest.mark.parametrize("every, total, saved_after", [
    (1, 5, [1, 2, 3, 4]),  # every step but the last: a state of every step done could not be resumed
    (2, 7, [2, 4, 6]),
    (3, 6, [3]),
    (0, 5, []),  # off
])
def test_a_state_is_due_every_n_steps_never_at_the_last_and_never_when_off(every, total, saved_after):
    assert [n for n in range(total + 1) if periodic.due(n, every, total)] == saved_after


class Run:
    """Rank 0 of a run with ``version`` steps done: the allocator, the hub and the rollout driver."""

    def __init__(self, run_dir, version: int):
        cfg = GyreConfig()
        self.clock = ManualClock()
        self.log = EventLog(run_dir / "events.jsonl", self.clock)
        self.server = AllocatorServer(make_policy("gyre", cfg.scheduler, 2), cfg.allocator,
                                      InProcessWorld(3).endpoint(0, self.clock), self.log, admit=lambda n: n,
                                      runs_per_query=2)
        self.hub = Hub(None, 2, True, 2, lambda cell: Role.TRAIN, lambda rec: None)
        self.hub.restore([], version)
        self.rollouts = Rollouts(run_dir, "http://127.0.0.1:9", self.hub.offer, agent=cfg.agent, grader=cfg.grader,
                                 model=cfg.model, engine=cfg.engine, trajectory=cfg.trajectory, seed=0, cells=2,
                                 batch_groups=2)
        self.steps = steps([0.5, 0.25, 0.0, 0.75][:version])

    def admitted(self, ready: list[int], inflight: list[int]) -> None:
        """The harness's bookkeeping: ``ready`` groups offered to the hub (nothing to train in them), ``inflight``
        still running."""
        r = self.rollouts
        r.admitted, r.next_gid = sorted(ready + inflight), max(ready + inflight) + 1
        for gid in ready:
            r.readied.add(gid)
            self.hub.offer(dp.Group(gid, None, 0, runs=2, gen_versions=(len(self.steps) - 1,)))

    def save(self, run_dir):
        return periodic.save(run_dir, self.server, self.hub, self.rollouts, self.steps, {}, 12.5, self.log.write)

    def close(self):
        self.rollouts.stop()
        self.log.close()


@pytest.fixture
def run(run_dir):
    runs = []

    def make(version):
        runs.append(Run(run_dir, version))
        return runs[-1]

    yield make
    for r in runs:
        r.close()


def test_a_periodic_state_holds_the_buffer_the_queries_in_flight_and_the_held_checkpoint(run_dir, run):
    write_latest(run_dir, 2)
    assert lost.hold(run_dir, 2)
    r = run(2)
    r.admitted(ready=[4, 5], inflight=[6, 7])
    rec = r.save(run_dir)
    assert {k: rec[k] for k in ("event", "steps_done", "version", "buffer", "inflight")} == {
        "event": "resume_saved", "steps_done": 2, "version": 2, "buffer": 2, "inflight": 2}
    assert rec["save_ms"] >= 0 and rec["state_bytes"] == (resume.resume_dir(run_dir) / resume.STATE).stat().st_size
    state = resume.load(run_dir)  # the allocator had not applied the steps: counters rebuilt from the records
    assert [(g["gid"], g["ready_version"]) for g in state["buffer"]] == [(4, 2), (5, 2)]
    assert state["inflight"] == [6, 7] and state["next_gid"] == 8
    assert state["sched"]["steps_done"] == 2 and state["counters"]["wall_s"] == 12.5
    linked = resume.resume_dir(run_dir) / resume.CHECKPOINT / "rank000.safetensors"
    assert os.stat(linked).st_ino == os.stat(lost.held_dir(run_dir) / "rank000.safetensors").st_ino
    logged = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in logged] == ["resume_saved"]
    r.rollouts.admit(1)  # the run goes on after the save: nothing was closed
    assert r.rollouts.admitted[-1] == 8


def test_a_failed_save_is_an_event_and_leaves_the_previous_state_as_it_was(run_dir, run):
    write_latest(run_dir, 2)
    lost.hold(run_dir, 2)
    r = run(2)
    r.admitted(ready=[4], inflight=[5])
    r.save(run_dir)
    before = (resume.resume_dir(run_dir) / resume.STATE).read_text()
    later = run(3)  # step 3 applied, but no checkpoint of version 3 anywhere
    later.admitted(ready=[6], inflight=[7])
    rec = later.save(run_dir)
    assert rec["event"] == "resume_save_failed" and rec["steps_done"] == 3
    assert "no checkpoint of version 3" in rec["error"]
    assert (resume.resume_dir(run_dir) / resume.STATE).read_text() == before
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".tmp-")]


def test_a_resume_from_an_older_state_moves_aside_the_files_of_queries_admitted_after_it(tmp_path):
    tito = tmp_path / "tito"
    tito.mkdir()
    for gid in (3, 6, 7):
        (tito / f"q{gid:05d}.jsonl").write_text(f'{{"gid": {gid}}}\n')
    moved = set_aside_from(tito, 6)  # the dead segment admitted 6 and 7 after the state was saved
    assert [p.name for p in moved] == ["q00006.jsonl.0", "q00007.jsonl.0"]
    assert sorted(p.name for p in tito.glob("*.jsonl")) == ["q00003.jsonl"]
    assert set_aside_from(tito, 6) == []


def test_the_interval_is_a_typed_config_key_that_refuses_negative_values():
    assert load_config("configs/local.yaml", []).run.resume_every_steps == 1
    assert load_config("configs/local.yaml", ["run.resume_every_steps=0"]).run.resume_every_steps == 0
    with pytest.raises(ConfigError, match="run.resume_every_steps"):
        load_config("configs/local.yaml", ["run.resume_every_steps=-1"])
    with pytest.raises(ConfigError, match="run.resume_every_steps"):
        load_config("configs/local.yaml", ["run.resume_every_steps=often"])
