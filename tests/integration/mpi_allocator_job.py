"""Launched by test_mpi_transport.py under mpirun: the real allocator server on rank 0, minimal cells on 1..K.

Rank 0 runs ``AllocatorServer`` with the in-repo policy over ``MpiTransport``; its harness finishes every
admitted query at once (each group is ready as soon as it is admitted). Ranks 1..K are minimal cell leaders
speaking the real protocol through ``CellLink``: a switch takes ``--switch-s`` and is answered with a timing
breakdown; the core cell, while training, reports B processed groups and then one optimizer step per burst
step. ``--die-cell c`` makes cell c kill itself with SIGKILL shortly after its Welcome. Every rank prints
one JSON line when it is done.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time

from gyre_hpc.allocator.cell_link import CellLink
from gyre_hpc.allocator.eventlog import EventLog
from gyre_hpc.allocator.messages import GroupsReady, RunsChanged, Shutdown, SwitchDone, SwitchTo, TrainProgress
from gyre_hpc.allocator.mpi_transport import MpiTransport, exit_process
from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.server import AllocatorServer
from gyre_hpc.allocator.types import Role
from gyre_hpc.config import AllocatorConfig, SchedulerConfig
from gyre_hpc.clock import WallClock


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", type=int, default=3)
    p.add_argument("--expect", type=int, default=None, help="expected world size (default 1 + cells)")
    p.add_argument("--events", required=True)
    p.add_argument("--policy", default="gyre")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tau-s", type=float, default=0.2)
    p.add_argument("--switch-s", type=float, default=0.05)
    p.add_argument("--heartbeat-timeout-s", type=float, default=1.5)
    p.add_argument("--die-cell", type=int, default=-1)
    return p.parse_args()


def allocator(args, transport, sched: SchedulerConfig, cfg: AllocatorConfig) -> dict:
    policy = make_policy(args.policy, sched, args.cells)
    counts = {"started": 0}

    def admit(n: int) -> int:  # the harness: each admitted query's runs end at once
        counts["started"] += n
        server.post(RunsChanged(runs=(0,) * args.cells, ended=counts["started"]))
        server.post(GroupsReady(groups=n, work_s=0.01 * n))
        return n

    server = AllocatorServer(policy, cfg, transport, EventLog(args.events, transport.clock), admit, runs_per_query=1)
    return {"summary": server.run()}


def cell(args, transport, sched: SchedulerConfig, cfg: AllocatorConfig) -> dict:
    link = CellLink(transport, transport.rank - 1, cfg.heartbeat_interval_s)
    welcome = link.hello(timeout_s=60.0)
    role, version, burst, orders = welcome.role, 0, 0, ["Welcome"]
    if link.cell == args.die_cell:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        link.beat()
        order = link.next_order(0.02)
        if order is not None:
            orders.append(type(order).__name__)
        if isinstance(order, Shutdown):
            link.bye()
            return {"cell": link.cell, "orders": orders, "heartbeats": link.seq, "version": version,
                    "lost": list(order.lost)}
        if isinstance(order, SwitchTo):
            t0 = time.monotonic()
            time.sleep(args.switch_s)
            stop = time.monotonic() - t0
            link.send(SwitchDone(cell=link.cell, role=order.role, order=order.order,
                                 timing={"drain_s": stop / 2, "engine_stop_s": stop / 2}))
            role, burst = order.role, 0
        core_trains = role is Role.TRAIN and welcome.core == link.cell
        if core_trains and (welcome.mu is None or burst < welcome.mu):
            b = sched.batch_groups
            link.send(TrainProgress(cell=link.cell, version=version, groups=b, work_s=0.01 * b, optimizing=True))
            time.sleep(0.02)
            version, burst = version + 1, burst + 1
            link.send(TrainProgress(cell=link.cell, version=version, mean_lag=0.5))


def main() -> None:
    args = parse()
    clock = WallClock()
    transport = MpiTransport(args.expect or 1 + args.cells, clock=clock)
    sched = SchedulerConfig(batch_groups=2, theta=0.5, tau_s=args.tau_s, mu=1, satellite_min_work_s=1e9)
    cfg = AllocatorConfig(steps=args.steps, heartbeat_interval_s=0.1, heartbeat_timeout_s=args.heartbeat_timeout_s,
                          hello_timeout_s=60.0, shutdown_timeout_s=10.0)
    out = (allocator if transport.rank == 0 else cell)(args, transport, sched, cfg)
    print(json.dumps({"rank": transport.rank, "size": transport.size, **out}), flush=True)
    exit_process(0, peers_lost=bool(out["summary"]["lost"] if "summary" in out else out["lost"]))


if __name__ == "__main__":
    main()
