"""In-process transport, polling back-off, the cell link, and the injected clocks."""
import threading

import pytest

from gyre_hpc.allocator.cell_link import CellLink
from gyre_hpc.allocator.messages import Bye, Heartbeat, Hello, Shutdown, SwitchTo, Welcome
from gyre_hpc.allocator.transport import Backoff, InProcessWorld
from gyre_hpc.allocator.types import Role
from gyre_hpc.clock import ManualClock, WallClock
from gyre_hpc.errors import CellLostError, ProtocolError


def test_messages_between_two_ranks_arrive_in_order_exactly_once():
    world = InProcessWorld(3)
    alloc, cell = world.endpoint(0), world.endpoint(2)
    for seq in range(50):
        cell.send(0, Heartbeat(cell=1, seq=seq))
    got = [alloc.poll() for _ in range(51)]
    assert got[-1] is None
    assert [(src, m.seq) for src, m in got[:-1]] == [(2, s) for s in range(50)]


def test_each_endpoint_decodes_its_own_direction():
    world = InProcessWorld(2)
    alloc, cell = world.endpoint(0), world.endpoint(1)
    alloc.send(1, SwitchTo(cell=0, role=Role.TRAIN, order=1))
    assert cell.poll() == (0, SwitchTo(cell=0, role=Role.TRAIN, order=1))
    alloc.send(1, Heartbeat(cell=0))  # an event sent the wrong way
    with pytest.raises(ProtocolError, match="'Heartbeat' is an event here") as exc:
        cell.poll()
    assert exc.value.source == 0


def test_a_bad_payload_raises_with_its_source_and_the_endpoint_stays_usable():
    world = InProcessWorld(3)
    alloc = world.endpoint(0)
    world.queues[0].put((2, {"type": "Nope"}))
    world.endpoint(1).send(0, Bye(cell=0))
    with pytest.raises(ProtocolError) as exc:
        alloc.poll()
    assert exc.value.source == 2
    assert alloc.poll() == (1, Bye(cell=0))


def test_sending_to_a_closed_endpoint_is_a_lost_cell_not_a_hang():
    world = InProcessWorld(2)
    world.endpoint(1).close()
    with pytest.raises(CellLostError, match="rank 1 has closed"):
        world.endpoint(0).send(1, Shutdown())


def test_sending_to_oneself_or_outside_the_world_is_refused():
    world = InProcessWorld(2)
    with pytest.raises(ValueError, match="cannot send to rank 2"):
        world.endpoint(0).send(2, Shutdown())
    with pytest.raises(ValueError, match="cannot send to rank 0"):
        world.endpoint(0).send(0, Shutdown())


def test_concurrent_senders_lose_nothing():
    world = InProcessWorld(5)
    senders = [threading.Thread(target=lambda r=r: [world.endpoint(r).send(0, Heartbeat(cell=r - 1, seq=s))
                                                    for s in range(300)]) for r in range(1, 5)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    alloc, got = world.endpoint(0), []
    while (m := alloc.poll()) is not None:
        got.append(m)
    for r in range(1, 5):
        assert [m.seq for src, m in got if src == r] == list(range(300))


def test_backoff_doubles_up_to_its_cap_and_never_past_the_time_left():
    clock = ManualClock()
    b = Backoff(clock, min_s=0.001, max_s=0.005)
    for _ in range(5):
        b.wait()
    b.wait(limit=0.002)
    b.reset()
    b.wait()
    assert clock.slept == [0.001, 0.002, 0.004, 0.005, 0.005, 0.002, 0.001]
    with pytest.raises(ValueError):
        Backoff(clock, min_s=0.01, max_s=0.001)


def test_recv_times_out_on_the_transport_clock_without_real_waiting():
    clock = ManualClock()
    world = InProcessWorld(2)
    alloc = world.endpoint(0, clock, backoff_max_s=0.005)
    assert alloc.recv(timeout=1.0) is None
    assert clock.now() == pytest.approx(1.0)
    assert max(clock.slept) == 0.005


def test_recv_returns_a_message_that_arrives_while_it_polls():
    clock = ManualClock()
    world = InProcessWorld(2)
    alloc, cell = world.endpoint(0, clock), world.endpoint(1, clock)
    clock.on_sleep.append(lambda now: now >= 0.3 and cell.send(0, Bye(cell=0)))
    src, msg = alloc.recv(timeout=10.0)
    assert (src, msg) == (1, Bye(cell=0))
    assert 0.3 <= clock.now() < 0.31


def test_short_recv_calls_in_a_loop_keep_backing_off_and_a_message_restarts_the_back_off():
    clock = ManualClock()
    world = InProcessWorld(2)
    alloc, cell = world.endpoint(0, clock, backoff_max_s=0.005), world.endpoint(1, clock)
    for _ in range(50):  # an idle loop of 2 ms waits (a cell awaiting its group): 0.1 s in all
        assert alloc.recv(timeout=0.002) is None
    assert clock.now() == pytest.approx(0.1)
    assert len(clock.slept) <= 60  # a fresh back-off per call slept 5 times a call (250 polls)
    assert max(clock.slept) <= 0.005  # the reaction-time bound holds
    cell.send(0, Bye(cell=0))
    assert alloc.recv(timeout=0.002) == (1, Bye(cell=0))
    clock.slept.clear()
    assert alloc.recv(timeout=0.001) is None
    assert clock.slept[0] == pytest.approx(1e-4)  # restarted at min_s after the message


def test_cell_link_beats_only_after_an_interval_of_silence_with_increasing_seq():
    clock = ManualClock()
    world = InProcessWorld(2)
    link = CellLink(world.endpoint(1, clock), cell=0, heartbeat_interval_s=1.0)
    alloc = world.endpoint(0, clock)
    assert not link.beat()
    clock.advance(0.6)
    link.send(Bye(cell=0))  # any message counts as a sign of life
    clock.advance(0.6)
    assert not link.beat()
    clock.advance(0.5)
    assert link.beat()
    clock.advance(1.0)
    assert link.beat()
    got = [alloc.poll()[1] for _ in range(3)]
    assert got == [Bye(cell=0), Heartbeat(cell=0, seq=1), Heartbeat(cell=0, seq=2)]


def test_cell_link_hello_returns_its_welcome_or_gives_up_in_time():
    clock = ManualClock()
    world = InProcessWorld(2)
    link = CellLink(world.endpoint(1, clock), cell=0, heartbeat_interval_s=1.0)
    alloc = world.endpoint(0, clock)
    welcome = Welcome(cell=0, role=Role.TRAIN, core=0, streaming=True, mu=1)
    clock.on_sleep.append(lambda now: (m := alloc.poll()) and alloc.send(1, welcome))
    assert link.hello(timeout_s=5.0, node="n1") == welcome
    clock.on_sleep.clear()
    with pytest.raises(CellLostError, match="no Welcome from the allocator within 2.0 s"):
        CellLink(world.endpoint(1, clock), cell=0, heartbeat_interval_s=1.0).hello(timeout_s=2.0)


def test_cell_link_hello_sends_its_identity():
    clock = ManualClock()
    world = InProcessWorld(3)
    link = CellLink(world.endpoint(2, clock), cell=1, heartbeat_interval_s=1.0)
    with pytest.raises(CellLostError):
        link.hello(timeout_s=0.1, node="n7")
    src, hello = world.endpoint(0).poll()
    assert src == 2 and hello.cell == 1 and hello.rank == 2 and hello.node == "n7" and hello.pid > 0
    assert isinstance(hello, Hello)


def test_after_bye_nothing_more_is_sent_and_the_endpoint_is_closed():
    world = InProcessWorld(2)
    link = CellLink(world.endpoint(1), cell=0, heartbeat_interval_s=1.0)
    link.bye()
    assert world.closed[1]
    with pytest.raises(ProtocolError, match="said Bye"):
        link.send(Heartbeat(cell=0))
    assert world.endpoint(0).poll() == (1, Bye(cell=0))


def test_manual_clock_moves_only_when_asked_and_runs_hooks_on_sleep():
    clock = ManualClock(5.0)
    seen = []
    clock.on_sleep.append(seen.append)
    assert clock.now() == 5.0
    clock.advance(1.0)
    clock.sleep(0.5)
    assert clock.now() == 6.5 and seen == [6.5]
    with pytest.raises(ValueError):
        clock.sleep(-1)


def test_wall_clock_is_monotonic_and_starts_near_zero():
    clock = WallClock()
    a = clock.now()
    clock.sleep(0.01)
    b = clock.now()
    assert 0 <= a < 1.0 and b - a >= 0.01
    with pytest.raises(ValueError):
        clock.sleep(-0.1)
