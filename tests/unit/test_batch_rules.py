"""The burst gate and the batch-start rule: one implementation (allocator.batches) for the simulator and the hub."""
from gyre_hpc.allocator import batches
from gyre_hpc.allocator.sim import trainer
from gyre_hpc.live import hub


def test_the_burst_gate_closes_once_the_burst_has_its_mu_steps():
    assert batches.burst_open(None, 10**6)
    assert batches.burst_open(2, 0) and batches.burst_open(2, 1)
    assert not batches.burst_open(2, 2) and not batches.burst_open(2, 3)


def test_a_fixed_batch_starts_only_when_whole_and_a_started_step_goes_on():
    assert not batches.batch_may_start(False, False, 3, 4)
    assert batches.batch_may_start(False, False, 4, 4)
    assert batches.batch_may_start(False, True, 1, 4)
    assert batches.batch_may_start(True, False, 1, 4)


def test_the_simulator_and_the_live_hub_call_the_allocators_rules():
    assert trainer.burst_open is batches.burst_open and trainer.batch_may_start is batches.batch_may_start
    assert hub.batch_may_start is batches.batch_may_start
