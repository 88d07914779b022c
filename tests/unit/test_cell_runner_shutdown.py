"""gyre_hpc.live.cell_runner: a satellite's weight pull that fails because the run ended (the core closed its weights
after Shutdown) ends the cell in order, and so does an engine registration that fails because rank 0 stopped the
proxy (a preemption while the cell switched to rollout); either failing while the run goes on still raises.

The race itself (Shutdown while a satellite pulls) happened in a live 4-cell SLURM run and ended the whole step
with exit 2; here the allocator is a real ``CellLink`` over the in-process transport and the only stand-in is the
pull that fails (the Mooncake peer that has gone, a true boundary).
"""
from concurrent.futures import ThreadPoolExecutor

import pytest

from gyre_hpc.allocator.cell_link import CellLink
from gyre_hpc.allocator.messages import Shutdown, SwitchTo
from gyre_hpc.allocator.transport import InProcessWorld
from gyre_hpc.allocator.types import Role
from gyre_hpc.live import cell_runner as runner_module
from gyre_hpc.live.cell_runner import CellRunner, _RunOver
from gyre_hpc.errors import TransferError
from gyre_hpc.proxy.routing import ProxyError


class GoneCore:
    """A satellite trainer whose core has closed its Mooncake segment."""

    def ensure(self, version=None):
        raise TransferError(f"Mooncake read failed (rc -1): version {version} from 127.0.0.1:15280")


class StoppedEngine:
    running = False


class ProxyGone(StoppedEngine):
    """A rollout side whose engine started but whose proxy no longer answers the registration."""

    def start(self):
        raise ProxyError("http://127.0.0.1:47135/admin/engines: no answer (ConnectError: [Errno 111] Connection "
                         "refused)", 503)


def satellite(world: InProcessWorld) -> CellRunner:
    runner = object.__new__(CellRunner)  # only the parts the switch and the pull use
    runner.cell, runner.is_core, runner.stash = 1, False, []
    runner.link = CellLink(world.endpoint(2), cell=1, heartbeat_interval_s=60.0)
    runner.trainer, runner.rollout = GoneCore(), StoppedEngine()
    runner.pool = ThreadPoolExecutor(max_workers=1)
    return runner


def test_a_pull_failing_after_shutdown_came_is_the_end_of_the_run_not_a_crash():
    world = InProcessWorld(3)
    world.endpoint(0).send(2, Shutdown(reason="2 optimizer steps done"))
    runner = satellite(world)
    with pytest.raises(_RunOver):
        runner._pull(2)
    assert [type(o) for o in runner.stash] == [Shutdown]  # the loop's next order: Bye follows


def test_a_pull_failing_while_the_run_goes_on_still_raises(monkeypatch):
    monkeypatch.setattr(runner_module, "SHUTDOWN_LOOK_S", 0.3)
    runner = satellite(InProcessWorld(3))
    with pytest.raises(TransferError, match="Mooncake read failed"):
        runner._pull(2)
    assert runner.stash == []


def test_a_switch_to_train_cut_by_shutdown_sends_no_switch_done():
    world = InProcessWorld(3)
    alloc = world.endpoint(0)
    alloc.send(2, Shutdown(reason="done"))
    runner = satellite(world)
    runner.switches = []
    runner._switch(SwitchTo(cell=1, role=Role.TRAIN, order=7))
    assert alloc.poll() is None  # the allocator, shutting down, waits only for Bye
    assert runner.switches == [] and isinstance(runner.stash[0], Shutdown)


def test_a_switch_to_rollout_whose_proxy_stopped_after_shutdown_sends_no_switch_done():
    world = InProcessWorld(3)
    alloc = world.endpoint(0)
    alloc.send(2, Shutdown(reason="preempted: SIGTERM"))
    runner = satellite(world)
    runner.switches, runner.rollout = [], ProxyGone()
    runner._switch(SwitchTo(cell=1, role=Role.ROLLOUT, order=8))
    assert alloc.poll() is None  # no SwitchDone: the allocator, shutting down, waits only for Bye
    assert runner.switches == [] and isinstance(runner.stash[0], Shutdown)


def test_a_registration_failing_while_the_run_goes_on_still_raises(monkeypatch):
    monkeypatch.setattr(runner_module, "SHUTDOWN_LOOK_S", 0.3)
    runner = satellite(InProcessWorld(3))
    runner.switches, runner.rollout = [], ProxyGone()
    with pytest.raises(ProxyError, match="no answer"):
        runner._switch(SwitchTo(cell=1, role=Role.ROLLOUT, order=8))
    assert runner.switches == [] and runner.stash == []
