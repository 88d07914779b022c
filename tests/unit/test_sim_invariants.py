"""Policy invariants checked on every decision of whole simulations (configs/sim/small.yaml)."""
import pytest

from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.sim import workload as workload_mod
from gyre_hpc.allocator.sim.compare import queries_needed
from gyre_hpc.allocator.sim.rollout import DONE
from gyre_hpc.allocator.sim.simulator import Simulation
from gyre_hpc.allocator.types import Admit, Role, Switch
from gyre_hpc.config import load_config

SMALL = "configs/sim/small.yaml"


class Checked:
    """Wraps a real policy; asserts the invariants of every decision against the state it was made on."""

    def __init__(self, inner, capacity, slots):
        self.inner, self.capacity, self.slots = inner, capacity, slots
        self.decisions = self.switch_orders = self.admitted = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decide(self, state, now):
        state.check()
        assert all(c.runs <= self.slots for c in state.cells), "a cell never holds more than its KV slots"
        orders = self.inner.decide(state, now)
        self.decisions += 1
        window = self.inner.window(state)
        for o in orders:
            if isinstance(o, Admit):
                assert state.inflight_groups + state.ready_groups + o.queries <= window
                if not self.inner.streaming:
                    assert o.queries % self.inner.cfg.batch_groups == 0, "fixed batches are admitted whole"
                self.admitted += o.queries
            if isinstance(o, Switch):
                assert state.cells[o.cell].role is not Role.LOST
        switches = [o for o in orders if isinstance(o, Switch)]
        self.switch_orders += len(switches)
        if self.inner.name == "gyre":
            self._gyre(state, switches)
        return orders

    def _gyre(self, state, switches):
        assert len(switches) <= 1, "gyre switches one cell at a time"
        if not switches:
            return
        assert not state.in_transition, "gyre never switches while a cell is in transition"
        (s,) = switches
        if s.target is Role.TRAIN:
            others = sum(1 for i, c in enumerate(state.cells) if c.role is Role.ROLLOUT and i != s.cell)
            assert state.unfinished_runs <= self.capacity * others, "remaining cells must absorb the runs"
            assert s.cell == state.core or state.cells[state.core].role is Role.TRAIN, "core trains first"
        elif s.cell == state.core:
            assert state.training_cells == [state.core], "core leaves training last"


def simulate(name, *overrides):
    cfg = load_config(SMALL, list(overrides))
    wl = workload_mod.load(cfg.workload, cfg.sim, queries_needed(cfg), cfg.run.seed,
                           j_max=cfg.trajectory.j_max)
    policy = Checked(make_policy(name, cfg.scheduler, cfg.cluster.cells), cfg.scheduler.capacity_runs_per_cell,
                     cfg.sim.kv_slots_per_cell)
    sim = Simulation(policy, cfg.sim, cfg.scheduler, wl, cfg.cluster.cells, cfg.workload.timeout_h * 3600)
    sim.run()
    return sim, policy, cfg


def overlap(timeline, end):
    """Sorted change points and the roles of every cell in each interval."""
    points = sorted({t for events in timeline for t, _ in events} | {end})
    out = []
    for t0, t1 in zip(points, points[1:]):
        if t1 > t0:
            out.append([[r for t, r in events if t <= t0][-1] for events in timeline])
    return out


@pytest.mark.parametrize("name", ["gyre", "colocate", "async", "async_streaming", "colocate_streaming"])
def test_every_decision_keeps_the_policy_invariants(name):
    sim, policy, cfg = simulate(name)
    assert sim.state.steps_done == cfg.sim.steps
    assert policy.decisions > 100 and policy.admitted > 0
    assert policy.switch_orders > 0 or name.startswith("async")


def test_gyre_moves_cells_mid_batch_and_keeps_one_transition_at_a_time():
    sim, policy, _ = simulate("gyre")
    assert sum(len(ev) - 1 for ev in sim.timeline[1:]) > 0, "satellites joined at least once"
    for roles in overlap(sim.timeline, sim.end):
        assert sum(r in ("draining", "loading") for r in roles) <= 1


def test_gyre_optimizer_state_stays_on_the_core():
    sim, _, _ = simulate("gyre")
    for roles in overlap(sim.timeline, sim.end):
        if any(r == "train" for r in roles[1:]):
            assert roles[0] == "train", "a satellite trains only while the core does"


def test_colocate_never_trains_while_generating():
    sim, _, _ = simulate("colocate")
    for roles in overlap(sim.timeline, sim.end):
        assert not ("train" in roles and "rollout" in roles)


def test_async_pools_are_fixed():
    sim, policy, cfg = simulate("async")
    assert policy.switch_orders == 0
    assert [ev for ev in sim.timeline] == [[(0.0, "train")]] * 2 + [[(0.0, "rollout")]] * 2


def test_staleness_bound_is_never_exceeded():
    sim, _, _ = simulate("gyre", "scheduler.max_staleness=1")
    stats = sim.ledger.stats()
    assert stats["staleness_max"] <= 1
    assert stats["masked_token_frac"] > 0  # the bound was active, not vacuous


def test_staleness_window_tracks_the_target():
    for target in (0.5, 1.5):
        sim, _, _ = simulate("gyre", f"scheduler.staleness_target={target}", "sim.steps=40")
        assert abs(sim.ledger.stats()["staleness_mean"] - target) < 0.35


def test_fixed_batches_wait_for_their_slowest_query():
    sim, _, cfg = simulate("colocate")
    b = cfg.scheduler.batch_groups
    for k, t in enumerate(sim.step_times):
        assert max(sim.q_end[k * b:(k + 1) * b]) <= t  # every query of batch k ended before its step


def test_work_is_conserved_and_timeouts_cut_runs_short():
    sim, _, _ = simulate("gyre")
    pool, work = sim.pool, sim.wl.work_s
    done = [r for r in range(len(work)) if pool.where[r] == DONE]
    assert done
    for r in done:
        did = pool.done_work(r)
        if pool.left[r] == 0.0:
            assert did >= work[r] - 1e-6  # finished: all its work (plus any move overhead)
        else:
            assert did < work[r]  # cut by the timeout: partial work only
    assert any(pool.left[r] > 0 for r in done) and any(pool.left[r] == 0 for r in done)


def test_paper_config_keeps_the_gyre_invariants():
    cfg = load_config("configs/sim/paper_2p4t.yaml")
    wl = workload_mod.load(cfg.workload, cfg.sim, queries_needed(cfg), cfg.run.seed,
                           j_max=cfg.trajectory.j_max)
    policy = Checked(make_policy("gyre", cfg.scheduler, cfg.cluster.cells), cfg.scheduler.capacity_runs_per_cell,
                     cfg.sim.kv_slots_per_cell)
    sim = Simulation(policy, cfg.sim, cfg.scheduler, wl, cfg.cluster.cells, cfg.workload.timeout_h * 3600)
    sim.run()
    assert sim.state.steps_done == 48 and policy.switch_orders >= 2 * 48
