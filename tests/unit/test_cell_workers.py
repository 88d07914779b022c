"""A cell's workers: every rank knows its role from its world rank alone, and the leader's trainer handle sends
each collective call to the workers before making it, and nothing else."""
import pytest

pytest.importorskip("mpi4py")

from gyre_hpc.live.workers import COLLECTIVE, MirroredTrainer, role_of  # noqa: E402


def test_roles_follow_the_layout_order_allocator_then_cells_of_w_workers_led_by_worker_0():
    roles = [role_of(r, 4) for r in range(9)]
    assert roles[0].cell is None and roles[0].in_control
    assert [(x.cell, x.worker) for x in roles[1:]] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert [x.rank for x in roles if x.in_control] == [0, 1, 5]  # the control world: allocator + leaders


def test_one_worker_cells_keep_the_control_world_of_one_process_per_cell():
    assert all(role_of(r, 1).in_control for r in range(5))


def test_every_mirrored_call_is_a_trainer_method():
    from gyre_hpc.train.step import Trainer

    assert all(callable(getattr(Trainer, name, None)) for name in COLLECTIVE)


class OrdersDouble:
    """Stands in for the cell communicator's sending end: records what the leader orders."""

    def __init__(self):
        self.sent = []

    def send(self, method, *args, **kwargs):
        self.sent.append((method, args, kwargs))


class TrainerDouble:
    def __init__(self):
        self.version, self.calls = 0, []
        self.model = "the leader's model"

    def export_weights(self):
        self.calls.append("export_weights")
        return {"w": 1}

    def set_version(self, v):
        self.calls.append(("set_version", v))
        self.version = v


def test_the_leader_orders_each_collective_call_before_making_it_and_reads_the_rest_alone():
    orders, trainer = OrdersDouble(), TrainerDouble()
    mirror = MirroredTrainer(trainer, orders)
    assert mirror.export_weights() == {"w": 1}
    mirror.version += 1
    assert mirror.model == "the leader's model" and mirror.version == 1
    assert orders.sent == [("export_weights", (), {}), ("set_version", (1,), {})]
    assert trainer.calls == ["export_weights", ("set_version", 1)]
