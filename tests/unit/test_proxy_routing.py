"""The proxy's routing core (pure): registry states, sticky / least-loaded / round-robin choice, drain, dead, remove."""
import random

import pytest

from gyre_hpc.proxy.routing import EngineState, NoEngineError, ProxyError, Router, RoutingError


def router(policy="sticky_least_loaded", engines=(("a", 0), ("b", 0), ("c", 1))):
    r = Router(policy)
    for name, cell in engines:
        r.add(name, f"http://127.0.0.1/{name}", cell)
    return r


# ------------------------------------------------------------------------------------------------ choice
def test_new_run_goes_to_least_loaded_engine_with_ties_to_the_first_added():
    r = router()
    assert r.start("k1", "run1").name == "a"  # all idle: first added
    assert r.start("k2", "run2").name == "b"
    assert r.start("k3", "run3").name == "c"
    r.finish("k2")
    assert r.start("k4", "run4").name == "b"  # b is the only idle one


def test_run_sticks_to_its_engine_even_when_another_is_less_loaded():
    r = router()
    r.start("k1", "run1")
    r.start("k2", "run1")  # a now has 2, b and c have 0
    assert r.start("k3", "run1").name == "a"
    r.finish("k1"), r.finish("k2"), r.finish("k3")
    assert r.start("k4", "run1").name == "a"  # sticky with nothing in flight too


def _pile(r, engine_runs):
    """Start one request per run on the named engines (each run pinned there by starting while it is least loaded)."""
    for name, runs in engine_runs.items():
        for run in runs:
            r._assigned[run] = name  # noqa: SLF001 - pin the run as an earlier sticky call would have
            r.start(f"{run}-k", run)


def test_a_run_leaves_its_overloaded_engine_once_nothing_of_it_is_in_flight_there():
    r = Router(balance_abs=4, balance_rel=1.5)
    r.add("a", "http://127.0.0.1/a", 0)
    _pile(r, {"a": [f"r{i}" for i in range(6)]})
    r.add("b", "http://127.0.0.1/b", 1)
    r.finish("r0-k")  # a holds 5, b 0: 5 - 0 > 4 and 5 > 1.5 x 0
    assert r.start("r0-k2", "r0").name == "b"


def test_a_run_stays_on_its_engine_within_the_balance_thresholds():
    r = Router(balance_abs=4, balance_rel=1.5)
    r.add("a", "http://127.0.0.1/a", 0)
    _pile(r, {"a": [f"r{i}" for i in range(5)]})
    r.add("b", "http://127.0.0.1/b", 1)
    r.finish("r0-k")  # a holds 4, b 0: 4 - 0 is not more than 4
    assert r.start("r0-k2", "r0").name == "a"


def test_rebalance_names_the_newest_lone_requests_of_an_overloaded_engine_down_to_the_mean():
    r = Router(balance_abs=4, balance_rel=1.5)
    r.add("a", "http://127.0.0.1/a", 0)
    _pile(r, {"a": [f"r{i}" for i in range(10)]})
    r._assigned["r9"] = "a"  # noqa: SLF001
    r.start("r9-k2", "r9")  # r9 has two requests in flight: never split
    r.add("b", "http://127.0.0.1/b", 1)
    # 11 in flight, mean 5: 6 may go, newest first, r9's two skipped
    assert r.rebalance() == ["r8-k", "r7-k", "r6-k", "r5-k", "r4-k", "r3-k"]
    assert [e.load for e in r.engines()] == [11, 0]  # naming changes nothing


def test_rebalance_names_nothing_with_one_active_engine_or_loads_within_the_thresholds():
    r = Router(balance_abs=4, balance_rel=1.5)
    r.add("a", "http://127.0.0.1/a", 0)
    _pile(r, {"a": [f"r{i}" for i in range(20)]})
    assert r.rebalance() == []  # nowhere to go
    r.add("b", "http://127.0.0.1/b", 1)
    r.add("c", "http://127.0.0.1/c", 2)
    r.drain(["b"])
    _pile(r, {"c": [f"s{i}" for i in range(16)]})  # a 20, c 16: 4 apart
    assert r.rebalance() == []


@pytest.mark.parametrize("seed", range(5))
def test_moving_what_rebalance_names_leaves_no_engine_overloaded(seed):
    rng = random.Random(seed)
    r = Router(balance_abs=4, balance_rel=1.5)
    r.add("e0", "http://127.0.0.1/e0", 0)
    _pile(r, {"e0": [f"r{i}" for i in range(rng.randint(10, 60))]})
    for cell in range(1, 4):
        r.add(f"e{cell}", f"http://127.0.0.1/e{cell}", cell)
        for key in r.rebalance():  # what the service does: abort there, continue on another engine
            run, source = r._requests[key][0], r.where(key)  # noqa: SLF001
            r.finish(key)
            assert r.start(key + "m", run, avoid=[source]).name != source
        assert not any(r.overloaded(e) for e in r.active()), [e.load for e in r.active()]


def test_round_robin_rotates_new_runs_over_active_engines():
    r = router("round_robin")
    picks = []
    for i in range(6):
        picks.append(r.start(f"k{i}", f"run{i}").name)
        r.finish(f"k{i}")
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_round_robin_keeps_a_run_with_requests_in_flight_on_its_engine():
    r = router("round_robin")
    first = r.start("k1", "run1").name
    assert r.start("k2", "run1").name == first
    r.start("k3", "other")
    assert r.start("k4", "run1").name == first


def test_avoid_is_a_preference_not_a_ban():
    r = router(engines=(("a", 0), ("b", 0)))
    assert r.start("k1", "run1", avoid=["a"]).name == "b"
    r.finish("k1")
    assert r.start("k2", "run2", avoid=["a", "b"]).name == "a"  # nothing else left: use the avoided one


def test_sticky_run_leaves_an_avoided_engine_when_nothing_of_it_is_in_flight():
    r = router(engines=(("a", 0), ("b", 0)))
    r.start("k1", "run1")
    r.finish("k1")
    assert r.start("k2", "run1", avoid=["a"]).name == "b"
    assert r.assigned("run1") == "b"


# ------------------------------------------------------------------------------------- draining and dead
@pytest.mark.parametrize("leave", ["drain", "mark_dead"])
def test_a_draining_or_dead_engine_receives_no_new_request(leave):
    r = router()
    r.start("k1", "run1")  # run1 on a
    getattr(r, leave)(["a"])
    picks = {r.start(f"n{i}", f"run{i % 3}").name for i in range(12)}
    assert "a" not in picks
    assert r.engine("a").state is (EngineState.DRAINING if leave == "drain" else EngineState.DEAD)


def test_no_active_engine_is_a_503():
    r = router(engines=(("a", 0),))
    r.drain(["a"])
    with pytest.raises(NoEngineError) as err:
        r.start("k", "run")
    assert err.value.status == 503


def test_drain_returns_exactly_the_requests_in_flight_on_the_cell():
    r = router()
    for i in range(5):
        r.start(f"k{i}", f"run{i}")  # a, b, c, a, b
    r.finish("k3")
    cell0 = r.cell_engines(0)
    assert cell0 == ["a", "b"]
    assert r.drain(cell0) == ["k0", "k1", "k4"]
    assert r.mark_dead(["c"]) == ["k2"]


def test_continuations_of_a_run_moved_off_a_draining_engine_join_one_engine():
    r = router()
    for k in ("k1", "k2", "k3"):
        r.start(k, "run1")  # three concurrent calls of one run on a
    r.start("x", "busy")  # b is busier than c
    r.drain(["a"])
    targets = []
    for k in ("k1", "k2", "k3"):  # each aborted request comes back and is resubmitted
        r.finish(k)
        targets.append(r.start(k + "'", "run1").name)
    assert targets == ["c", "c", "c"]


def test_a_dead_engine_stays_dead_when_drained_and_add_makes_it_active_again_once_empty():
    r = router()
    r.start("k1", "run1")
    r.mark_dead(["a"])
    with pytest.raises(RoutingError, match="still leaving") as err:
        r.add("a", "http://127.0.0.1/a2", 0)
    assert err.value.status == 409
    r.finish("k1")
    r.drain(["a"])
    assert r.engine("a").state is EngineState.DEAD
    r.add("a", "http://127.0.0.1/a2", 0)
    assert r.engine("a").state is EngineState.ACTIVE and r.engine("a").url == "http://127.0.0.1/a2"


# ---------------------------------------------------------------------------------------- bookkeeping
def test_load_counts_requests_in_flight_and_a_double_finish_is_an_error():
    r = router()
    r.start("k1", "run1")
    r.start("k2", "run1")
    assert r.engine("a").load == 2
    assert r.finish("k1") == "a"
    with pytest.raises(RoutingError, match="not in flight"):
        r.finish("k1")
    with pytest.raises(RoutingError, match="already in flight"):
        r.start("k2", "run2")
    assert r.engine("a").load == 1


def test_remove_refuses_an_active_or_busy_engine_and_forgets_assignments():
    r = router()
    r.start("k1", "run1")
    with pytest.raises(RoutingError, match="ACTIVE") as err:
        r.remove("b")
    assert err.value.status == 409
    r.drain(["a"])
    with pytest.raises(RoutingError, match="in flight"):
        r.remove("a")
    r.finish("k1")
    r.remove("a")
    assert r.assigned("run1") is None and [e.name for e in r.engines()] == ["b", "c"]
    with pytest.raises(RoutingError, match="unknown engine 'a'; known engines: b, c") as err:
        r.engine("a")
    assert err.value.status == 404


def test_release_forgets_a_finished_run_but_not_one_in_flight():
    r = router()
    r.start("k1", "run1")
    r.release("run1")
    assert r.assigned("run1") == "a"
    r.finish("k1")
    r.release("run1")
    assert r.assigned("run1") is None


def test_bad_registrations_are_refused():
    r = router()
    with pytest.raises(RoutingError, match="cell"):
        r.add("d", "http://x", -1)
    with pytest.raises(RoutingError, match="already registered as engine 'a'"):
        r.add("d", "http://127.0.0.1/a", 0)
    with pytest.raises(ProxyError, match="proxy.routing"):
        Router("random")


# ------------------------------------------------------------------------------------ random schedules
@pytest.mark.parametrize("policy", ["sticky_least_loaded", "round_robin"])
@pytest.mark.parametrize("seed", range(5))
def test_random_schedules_keep_each_run_on_one_serving_engine(policy, seed):
    """Random starts, finishes, drains, deaths and re-adds: after every step each run's requests on ACTIVE
    engines are on one engine, and no request was started on a DRAINING or DEAD engine."""
    rng = random.Random(seed)
    names = ["a", "b", "c", "d"]
    r = Router(policy)
    for i, n in enumerate(names):
        r.add(n, f"http://h/{n}", i // 2)
    live: dict[str, str] = {}  # key -> run
    for step in range(400):
        op = rng.random()
        if op < 0.5:
            key, run = f"k{step}", f"run{rng.randrange(6)}"
            try:
                eng = r.start(key, run)
            except NoEngineError:
                continue
            assert eng.state is EngineState.ACTIVE
            live[key] = run
        elif op < 0.85 and live:
            key = rng.choice(sorted(live))
            r.finish(key)
            del live[key]
        elif op < 0.92:
            r.drain([rng.choice(names)])
        elif op < 0.95:
            r.mark_dead([rng.choice(names)])
        else:
            n = rng.choice(names)
            try:
                r.add(n, f"http://h/{n}", names.index(n) // 2)
            except RoutingError:
                assert r.engine(n).in_flight and r.engine(n).state is not EngineState.ACTIVE
        serving: dict[str, set[str]] = {}
        for e in r.active():
            for key in e.in_flight:
                serving.setdefault(live[key], set()).add(e.name)
        assert all(len(engines) == 1 for engines in serving.values()), serving
        assert sum(e.load for e in r.engines()) == len(live)


def test_the_routing_core_imports_only_the_standard_library():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('numpy', 'yaml', 'httpx', 'fastapi', 'torch', 'uvicorn'):
                    raise ImportError('routing imported ' + name)
        sys.meta_path.insert(0, Block())
        import gyre_hpc.proxy.routing
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("key,value", [("balance_abs_threshold", -1), ("balance_rel_threshold", 0.5)])
def test_a_balance_threshold_out_of_range_fails_at_load_with_the_dotted_key(key, value):
    from gyre_hpc.config import load_config
    from gyre_hpc.errors import ConfigError

    with pytest.raises(ConfigError, match=f"proxy.{key}"):
        load_config("configs/local.yaml", [f"proxy.{key}={value}"])
