"""A cell's workers: one process per GPU; worker 0 leads the cell, the others do what it orders (edge: mpi4py).

::

    world (MPI.COMM_WORLD)   rank 0 allocator · cell k = ranks 1 + kW .. kW + W  (W workers, gyre_hpc.slurm.layout)
    control = Split(world)   rank 0 and every cell's worker 0, in world order, so ranks 0..K: the allocator protocol
                             (MpiTransport) and the data plane run on it exactly as with one process per cell
    cell comm = Split(world) the cell's W workers, the leader first: its orders

SPMD by order: the leader's training side reaches its ``Trainer`` through ``MirroredTrainer``. Every call that
involves the cell's collectives (tensor-parallel gathers, data-parallel all-reduces, per-rank checkpoint files)
is first sent to every other worker of the cell, then made on the leader; each worker makes the same call on its
own ``Trainer``, in the same order, with the same arguments. torch.distributed joins the cell's W workers (gloo on
the CPU, NCCL on GPUs) with megatron's groups: TP consecutive workers of one node, DP = W / TP replicas, which
split each group's micro-batches between them (``Trainer.forward_backward``).

    leader (worker 0)                                   worker i > 0
      trainer.group_grads_full(batch)  ──order──▶        follow(): trainer.group_grads_full(batch)
        forward/backward of its micro-batches ◀─gloo─▶     forward/backward of its micro-batches
        full gradients (TP gathered, DP summed)            (its result is dropped)

The rollout side needs no order: the leader serves the cell's engine replicas, one per ``engine.tp`` workers
(gyre_hpc.live.rollout_side); the workers wait.

Invariants (tests/integration/test_cell_workers.py, tests/unit/test_cell_workers.py)
- The control world has exactly 1 + K ranks in the order the allocator knows (0 = allocator, k + 1 = cell k's
  leader): nothing in the allocator protocol or the data plane depends on the number of workers.
- Every collective trainer call the leader makes is made by each worker of its cell, in the same order and with
  the same arguments; a non-collective read (the model's parameters, the version) is the leader's own.
- A worker never sends to rank 0 or to another cell; it waits for orders by polling with back-off (no busy MPI
  wait), and on ``stop`` answers with what it did (``WorkerReport``) and returns.
- A worker whose order raises ends the world (the rank's error path: MPI_Abort), since its leader would otherwise
  wait in a collective for it.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from mpi4py import MPI

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import ClusterConfig

ORDER, REPORT = 0x6F72, 0x7270  # "or", "rp"
#: trainer calls that involve the cell's collectives: mirrored on every worker
COLLECTIVE = ("group_grads_full", "apply_grads", "load_weights", "export_weights", "save_checkpoint",
              "load_checkpoint", "set_version", "publish_weights")
#: collective calls whose first argument (a transfer publisher) lives on the leader, the sender, only: the workers
#: get None in its place and take part in the collectives alone (``Trainer.publish_weights``)
SENDER_ONLY = ("publish_weights",)
POLL_MAX_S = 0.02  # longest back-off between two polls of an idle worker
STOP_WAIT_S = 30.0  # how long a leader waits for its workers' reports at the end
STORE_TIMEOUT_S = 600.0  # how long the cell's workers may take to meet (a loaded machine starts slowly)


@dataclass(frozen=True)
class RankPlace:
    """Where this process is in the world: the allocator (cell None), or worker ``worker`` of ``cell``."""

    rank: int
    cell: int | None
    worker: int | None

    @property
    def in_control(self) -> bool:
        """The allocator or a cell's leader: a rank of the control world."""
        return self.cell is None or self.worker == 0


def role_of(rank: int, workers_per_cell: int) -> RankPlace:
    """Rank ``rank``'s role in a world of 1 + K x ``workers_per_cell`` ranks (``gyre_hpc.slurm.layout``'s order)."""
    if rank == 0:
        return RankPlace(0, None, None)
    return RankPlace(rank, (rank - 1) // workers_per_cell, (rank - 1) % workers_per_cell)


@dataclass
class Worlds:
    """This process's communicators: ``control`` (COMM_NULL for a follower) and ``cell`` (COMM_NULL for rank 0)."""

    role: RankPlace
    control: Any
    cell: Any
    hosts: tuple[str, ...] = ()  # the host name of each worker of the cell, in worker order

    @property
    def size(self) -> int:
        """Workers of this process's cell (1 for the allocator)."""
        return 1 if self.cell == MPI.COMM_NULL else self.cell.Get_size()


def split_world(cluster: ClusterConfig, world: Any = None) -> Worlds:
    """Collective over the world: the control world and this rank's cell communicator (module docstring)."""
    world = world or MPI.COMM_WORLD
    role = role_of(world.Get_rank(), cluster.workers_per_cell)
    control = world.Split(0 if role.in_control else MPI.UNDEFINED, role.rank)
    cell = world.Split(MPI.UNDEFINED if role.cell is None else role.cell, role.rank)
    for comm in (control, cell):
        if comm != MPI.COMM_NULL:
            comm.Set_errhandler(MPI.ERRORS_RETURN)
    hosts = () if cell == MPI.COMM_NULL else tuple(cell.allgather(socket.gethostname()))
    return Worlds(role, control, cell, hosts)


@dataclass(frozen=True)
class Geometry:
    """How the cell's trainer joins torch.distributed: ``size`` workers, TP ``tp``, met at ``address:port``."""

    size: int
    tp: int
    address: str
    port: int
    loopback: bool  # the whole cell on one host: gloo's pairs connect over lo (GLOO_SOCKET_IFNAME)
    ep: int = 1  # expert parallel (MoE: train.expert_parallel; the whole cell is one expert-parallel group)


@dataclass
class WorkerReport:
    """What a worker did, sent to its leader on ``stop``."""

    worker: int
    orders: int = 0
    calls: dict = field(default_factory=dict)

    @property
    def trained(self) -> bool:
        return self.calls.get("group_grads_full", 0) > 0


class Orders:
    """The leader's end of its cell communicator: orders out, reports back."""

    def __init__(self, comm: Any, cluster: ClusterConfig, hosts: tuple[str, ...] = (), clock: Clock | None = None):
        self.comm, self.cluster = comm, cluster
        self.one_host = len(set(hosts)) <= 1  # the whole cell on this machine: it meets on loopback
        self.clock = clock or WallClock()
        self.sent = 0

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def send(self, method: str, *args: Any, **kwargs: Any) -> None:
        for dest in range(1, self.size):
            self.comm.send((method, args, kwargs), dest=dest, tag=ORDER)
        self.sent += 1

    def meeting(self, ep: int = 1) -> tuple[Geometry, Any]:
        """Where the cell's torch.distributed world meets, and its store: the leader hosts a TCP store on a port
        the system gives it (bound before anyone is told of it, so no other process can take it meanwhile)."""
        from datetime import timedelta

        import torch.distributed as dist

        address = "127.0.0.1" if self.one_host else _address(socket.gethostname())
        store = dist.TCPStore(address, 0, self.size, True, timedelta(seconds=STORE_TIMEOUT_S),
                              wait_for_workers=False)
        return Geometry(self.size, self.cluster.tensor_parallel, address, store.port, self.one_host, ep), store

    def stop(self) -> list[WorkerReport]:
        """Tell every worker to return; their reports, in worker order (a worker that never answers: none)."""
        self.send("stop")
        reports = []
        for src in range(1, self.size):
            msg = _poll(self.comm, src, REPORT, self.clock, STOP_WAIT_S)
            if msg is not None:
                reports.append(msg)
        return reports


def _address(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


def _poll(comm: Any, source: int, tag: int, clock: Clock, timeout_s: float | None = None) -> Any:
    """The next message from ``source`` with ``tag``, polling with back-off; None after ``timeout_s``."""
    delay, waited = 1e-4, 0.0
    while True:
        msg = comm.improbe(source=source, tag=tag)
        if msg is not None:
            return msg.recv()
        if timeout_s is not None and waited >= timeout_s:
            return None
        clock.sleep(delay)
        waited += delay
        delay = min(2 * delay, POLL_MAX_S)


class MirroredTrainer:
    """The leader's handle on its cell's ``Trainer``: a collective call goes to every worker, then runs here."""

    def __init__(self, trainer: Any, orders: Orders):
        self._trainer, self._orders = trainer, orders

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._trainer, name)
        if name not in COLLECTIVE:
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            sent = (None, *args[1:]) if name in SENDER_ONLY else args
            self._orders.send(name, *sent, **kwargs)
            return value(*args, **kwargs)

        return call

    @property
    def version(self) -> int:
        return self._trainer.version

    @version.setter
    def version(self, value: int) -> None:
        self.set_version(value)


def build_trainer(model, train, seed: int, clock: Clock | None, orders: Orders | None) -> Any:
    """The cell's trainer as its leader sees it: a plain ``Trainer`` in a one-worker cell; with workers, every
    worker builds its own in the cell's torch.distributed world and the leader's is a ``MirroredTrainer``."""
    from gyre_hpc.train.model import init_parallel
    from gyre_hpc.train.step import Trainer

    if orders is None or orders.size == 1:
        init_parallel(seed=seed)
        return Trainer(model, train, seed, clock=clock)
    geo, store = orders.meeting(train.expert_parallel)
    orders.send("init", model, train, seed, geo)
    _join(geo, 0, seed, store)
    return MirroredTrainer(Trainer(model, train, seed, clock=clock), orders)


def _join(geo: Geometry, worker: int, seed: int, store: Any = None) -> None:
    """Join the cell's torch.distributed world (the leader passes the store it hosts; a worker connects to it)."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    from gyre_hpc.train.model import init_parallel

    if geo.loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if store is None:
        store = dist.TCPStore(geo.address, geo.port, geo.size, False, timedelta(seconds=STORE_TIMEOUT_S))
    init_parallel(world_size=geo.size, rank=worker, tensor_parallel=geo.tp, seed=seed, store=store,
                  expert_parallel=geo.ep)


def follow(comm: Any, clock: Clock | None = None) -> WorkerReport:
    """A worker's life: make the trainer calls its leader orders until ``stop``; returns (and sends) its report."""
    from gyre_hpc.train.step import Trainer

    clock = clock or WallClock()
    report = WorkerReport(comm.Get_rank())
    trainer = None
    while True:
        method, args, kwargs = _poll(comm, 0, ORDER, clock)
        if method == "stop":
            comm.send(report, dest=0, tag=REPORT)
            return report
        report.orders += 1
        report.calls[method] = report.calls.get(method, 0) + 1
        if method == "init":
            model, train, seed, geo = args
            _join(geo, report.worker, seed)
            trainer = Trainer(model, train, seed, clock=clock)
        else:
            getattr(trainer, method)(*args, **kwargs)
