"""The proxy in front of two real local engine processes (megatron GPTModel on the CPU), as the harness uses it.

One proxy process and two engine processes per module (an engine costs ~8-20 s of torch + megatron import on
the shared CPU). Calls are greedy, so a call moved between engines must produce exactly the tokens one engine
produces alone (same weights, no KV cache, a sequence's logits do not depend on its batch mates): that is the
check that a move is invisible to the harness. Tests that pause, drain or relabel an engine undo it before they
return; the test that kills an engine's process runs last.
"""
import concurrent.futures
import os
import signal
import time

import pytest

from gyre_hpc.config import EngineConfig, ModelConfig, ProxyConfig
from gyre_hpc.engines.client import EngineClient
from gyre_hpc.engines.launch import on_free_port, start_local_engine
from gyre_hpc.proxy.client import ProxyClient
from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.proxy.launch import start_proxy
from gyre_hpc.proxy.routing import ProxyError
from gyre_hpc.trajectory.records import read_tito

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow, pytest.mark.serial]

MODEL = ModelConfig()  # the embedded CPU default (tiny Qwen3 format)
ENGINE = EngineConfig(max_running_requests=8, context_len=256, request_timeout_s=120.0)
PROMPT = [5, 17, 42, 99, 3]
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Engines e0 (cell 0) and e1 (cell 1) behind one proxy; yields (proxy handle, {name: engine handle}, events)."""
    tmp = tmp_path_factory.mktemp("proxy")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(on_free_port, start_local_engine, ENGINE, MODEL, seed=0,
                               log_path=tmp / f"engine{i}.log") for i in range(2)]
        engines = {f"e{i}": f.result() for i, f in enumerate(futures)}
    events = tmp / "events.jsonl"
    cfg = ProxyConfig(event_log=str(events), no_engine_wait_s=3.0, request_timeout_s=120.0, health_timeout_s=1.0,
                      tito_dir=str(tmp / "tito"))
    proxy = on_free_port(start_proxy, cfg, log_path=tmp / "proxy.log")
    try:
        with ProxyClient(proxy.url, timeout=120.0) as admin:
            for i, (name, handle) in enumerate(engines.items()):
                admin.add_engine(handle.url, cell=i, name=name)
        yield proxy, engines, events
    finally:
        proxy.stop()
        for handle in engines.values():
            handle.stop()


@pytest.fixture
def proxy(cluster):
    with ProxyClient(cluster[0].url, timeout=120.0) as client:
        yield client


@pytest.fixture
def engines(cluster):
    clients = {name: h.client(timeout=120.0) for name, h in cluster[1].items()}
    yield clients
    for c in clients.values():
        c.close()


def _wait(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)
    return value


def _generated(client: EngineClient) -> int:
    return int(client._http.get("/server_info").json()["generated_tokens"])


def _in_flight(proxy: ProxyClient) -> dict[str, int]:
    return {e["name"]: e["in_flight"] for e in proxy.engines()}


def _all_in_flight(proxy: ProxyClient, n: int) -> dict[str, int] | None:
    loads = _in_flight(proxy)
    return loads if sum(loads.values()) == n else None


def _flush(proxy: ProxyClient, tmp_path, runs) -> "TitoLog":
    """Post an outcome for each run, flush exactly those runs, and read the file back (validated)."""
    for run in runs:
        proxy.outcome(run, "scored", 1.0)
    flushed = proxy.flush_tito(f"{tmp_path.name}-tito.jsonl", runs)
    assert flushed["runs"] == sorted(runs)
    return read_tito(flushed["path"], vocab_size=MODEL.vocab_size)


def _new_events(cluster, since: int) -> list[dict]:
    return read_events(cluster[2])[since:]


def _background(pool, proxy_url, rid, n, prompt=PROMPT):
    def call():
        with ProxyClient(proxy_url, timeout=120.0) as c:
            return c.generate(prompt, rid, {"max_new_tokens": n, **GREEDY})
    return pool.submit(call)


# --------------------------------------------------------------------------------------------------- calls
def test_a_call_through_the_proxy_is_the_engines_answer_recorded_once(cluster, proxy, engines, tmp_path):
    direct = engines["e0"].generate(PROMPT, {"max_new_tokens": 12, **GREEDY})
    with EngineClient(cluster[0].url, timeout=120.0) as harness:  # the harness's SGLang client, unchanged
        res = harness.generate(PROMPT, {"max_new_tokens": 12, **GREEDY}, rid="q1-r0/c0")
    assert res.rid == "q1-r0/c0" and res.output_ids == direct.output_ids and res.finish_reason == "length"
    assert res.logprobs == pytest.approx(direct.logprobs, abs=1e-5)
    assert [(s.version, s.start, s.end) for s in res.weight_versions] == [("0", 0, 12)]
    log = _flush(proxy, tmp_path, ["q1-r0"])
    (c,) = log.calls
    assert (c.run_id, c.query_id, c.call_id) == ("q1-r0", "q1", "c0")
    assert c.input_ids.tolist() == PROMPT and c.output_ids.tolist() == list(direct.output_ids)
    assert c.engine == res.meta_info["proxy"]["engines"] and c.t_end >= c.t_start > 0


def test_bad_calls_are_refused_with_the_key_and_engine_refusals_pass_through(proxy):
    with pytest.raises(ProxyError, match="rid: expected '<run_id>/<call_id>'") as err:
        proxy.generate(PROMPT, "no-call-id")
    assert err.value.status == 400
    with pytest.raises(ProxyError, match="sampling_params.temprature") as err:  # the engine's own 400
        proxy.generate(PROMPT, "q2-r0/c0", {"max_new_tokens": 2, "temprature": 0.5})
    assert err.value.status == 400
    proxy.generate(PROMPT, "q2-r0/c0", {"max_new_tokens": 2})  # a refused call does not take its call id


def test_concurrent_runs_stick_to_one_engine_and_spread_over_both(cluster, proxy, tmp_path):
    runs = [f"q3-r{i}" for i in range(6)]

    def run(run_id):
        with ProxyClient(cluster[0].url, timeout=120.0) as c:
            return [c.generate(PROMPT + [i], f"{run_id}/c{i}", {"max_new_tokens": 48, **GREEDY})
                    .meta_info["proxy"]["engines"] for i in range(3)]

    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        served = dict(zip(runs, pool.map(run, runs)))
    assert all(len(set(engines)) == 1 for engines in served.values()), served
    assert {e[0] for e in served.values()} == {"e0", "e1"}, served
    log = _flush(proxy, tmp_path, runs)
    assert len(log.calls) == 18 and all(len({c.engine for c in log.runs[r]}) == 1 for r in runs)


def test_the_harness_can_abort_its_own_call_and_it_is_not_moved(cluster, proxy, engines, tmp_path):
    since = len(read_events(cluster[2]))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = _background(pool, cluster[0].url, "q4-r0/c0", 200)
        name = _wait(lambda: next((n for n, k in _in_flight(proxy).items() if k), None))
        before = _generated(engines[name])
        _wait(lambda: _generated(engines[name]) > before + 3)
        assert proxy.abort("q4-r0/c0") == 1
        res = fut.result(60)
    assert res.finish_reason == "abort" and 0 < len(res.output_ids) < 200
    assert not [e for e in _new_events(cluster, since) if e["event"] == "move"]
    (c,) = _flush(proxy, tmp_path, ["q4-r0"]).calls
    assert c.finish_reason == "abort" and len(c.output_ids) == len(res.output_ids)


# --------------------------------------------------------------------------------------------------- moves
def test_draining_an_engine_mid_call_moves_it_and_the_harness_gets_the_whole_answer(cluster, proxy, engines,
                                                                                    tmp_path):
    n = 160
    reference = engines["e0"].generate(PROMPT, {"max_new_tokens": n, **GREEDY}).output_ids
    first = proxy.generate(PROMPT[:2], "q5-r0/c0", {"max_new_tokens": 1, **GREEDY})
    source = first.meta_info["proxy"]["engines"]  # q5-r0 sticks to this engine
    target = "e1" if source == "e0" else "e0"
    engines[target].update_weight_version("7")  # relabel: the continuation's tokens carry version 7
    since = len(read_events(cluster[2]))
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = _background(pool, cluster[0].url, "q5-r0/c1", n)
            _wait(lambda: _in_flight(proxy)[source] == 1)
            before = _generated(engines[source])
            _wait(lambda: _generated(engines[source]) >= before + 5)
            engines[source].pause("in_place")  # hold it mid-generation while the cell leaves rollout
            drained = proxy.drain(engine=source)
            res = fut.result(60)
    finally:
        engines[source].resume()
        engines[target].update_weight_version("0")
    assert drained["moved"] == 1 and drained["left"] == []
    assert res.finish_reason == "length" and res.output_ids == reference  # as if never moved
    events = _new_events(cluster, since)
    (move,) = [e for e in events if e["event"] == "move"]
    k = move["partial_tokens"]
    assert 5 <= k < n and move["reason"] == "drain" and (move["from_engine"], move["to_engine"]) == (source, target)
    assert move["reprefill_tokens"] == len(PROMPT) + k and move["moved_tokens"] == 0 and move["seconds"] >= 0
    assert [e["event"] for e in events if e.get("engine") == source] == ["engine_draining", "engine_drained"]
    assert [(s.version, s.start, s.end) for s in res.weight_versions] == [("0", 0, k), ("7", k, n)]
    assert proxy.stats()["runs_moved"] >= 1 and proxy.stats()["runs_lost"] == 0
    log = _flush(proxy, tmp_path, ["q5-r0"])
    moved = log.calls[-1]  # ONE call, spanning both engines and versions
    assert [c.call_id for c in log.calls] == ["c0", "c1"] and moved.engine == f"{source}>{target}"
    assert moved.output_versions.tolist() == [0] * k + [7] * (n - k)
    assert moved.output_ids.tolist() == list(reference)
    proxy.add_engine(cluster[1][source].url, cell=int(source[1]), name=source)  # back in rollout
    assert {e["name"]: e["state"] for e in proxy.engines()} == {"e0": "active", "e1": "active"}


def test_a_call_its_engine_aborts_on_its_own_continues_elsewhere_with_its_partial_output(cluster, proxy, engines,
                                                                                         tmp_path):
    """An abort the proxy did not ask for (here a weight-version update with abort_all_requests; also what an
    engine does on SIGTERM) is a move too: the partial output is kept and the call continues on another engine."""
    n = 160
    reference = engines["e0"].generate(PROMPT, {"max_new_tokens": n, **GREEDY}).output_ids
    since = len(read_events(cluster[2]))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = _background(pool, cluster[0].url, "q9-r0/c0", n)
        source = _wait(lambda: next((name for name, k in _in_flight(proxy).items() if k), None))
        before = _generated(engines[source])
        _wait(lambda: _generated(engines[source]) >= before + 3)
        try:
            engines[source].update_weight_version("0", abort_all_requests=True)
            res = fut.result(60)
        finally:
            engines[source].update_weight_version("0")
    assert res.output_ids == reference and res.finish_reason == "length"
    (move,) = [e for e in _new_events(cluster, since) if e["event"] == "move"]
    assert move["reason"] == "engine_abort" and move["from_engine"] == source and move["to_engine"] != source
    assert move["partial_tokens"] >= 3 and move["reprefill_tokens"] == len(PROMPT) + move["partial_tokens"]
    (c,) = _flush(proxy, tmp_path, ["q9-r0"]).calls
    assert c.engine == f"{source}>{move['to_engine']}" and c.output_ids.tolist() == list(reference)


def test_an_engine_marked_dead_while_hung_loses_no_call(cluster, proxy, engines, tmp_path):
    n = 120
    reference = engines["e1"].generate(PROMPT, {"max_new_tokens": n, **GREEDY}).output_ids
    since = len(read_events(cluster[2]))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = _background(pool, cluster[0].url, "q6-r0/c0", n)
        hung = _wait(lambda: next((name for name, k in _in_flight(proxy).items() if k), None))
        before = _generated(engines[hung])
        _wait(lambda: _generated(engines[hung]) > before)
        engines[hung].pause("in_place")  # it stops answering the call
        try:
            assert proxy.mark_dead(engine=hung, reason="heartbeat lost")["moved"] == 1
            res = fut.result(60)
        finally:
            engines[hung].resume()
    assert res.output_ids == reference and res.finish_reason == "length"
    events = _new_events(cluster, since)
    (dead,) = [e for e in events if e["event"] == "engine_dead"]
    assert dead["engine"] == hung and dead["reason"] == "heartbeat lost"
    (move,) = [e for e in events if e["event"] == "move"]
    assert move["reason"] == "dead" and move["reprefill_tokens"] == len(PROMPT) + move["output_tokens"]
    assert len(_flush(proxy, tmp_path, ["q6-r0"]).calls) == 1
    _wait(lambda: _in_flight(proxy)[hung] == 0)
    proxy.add_engine(cluster[1][hung].url, cell=int(hung[1]), name=hung)


def test_a_call_waits_for_an_engine_when_none_serves_and_fails_clearly_if_none_comes(cluster, proxy):
    for name in ("e0", "e1"):
        proxy.drain(engine=name)
    try:
        with pytest.raises(ProxyError, match="no ACTIVE rollout engine for 3 s") as err:
            proxy.generate(PROMPT, "q7-r0/c0", {"max_new_tokens": 2})
        assert err.value.status == 503
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = _background(pool, cluster[0].url, "q7-r1/c0", 4)
            time.sleep(0.5)
            proxy.add_engine(cluster[1]["e1"].url, cell=1, name="e1")  # a cell comes back to rollout
            assert len(fut.result(60).output_ids) == 4
    finally:
        for i, name in enumerate(("e0", "e1")):
            proxy.add_engine(cluster[1][name].url, cell=i, name=name)


def test_calls_that_waited_for_any_engine_spread_when_the_next_engine_joins(cluster, proxy, engines, tmp_path):
    """All cells left rollout (colocate's training) while calls were in flight: they wait, land together on the
    first engine back, and move to the next one when it joins (Router.rebalance), each answer exact."""
    n, calls = 24, 8
    reference = engines["e0"].generate(PROMPT, {"max_new_tokens": n, **GREEDY}).output_ids
    for name in ("e0", "e1"):
        proxy.drain(engine=name)
    since = len(read_events(cluster[2]))
    engines["e0"].pause("in_place")  # the first engine back holds what it gets until the second one joins
    try:
        with concurrent.futures.ThreadPoolExecutor(calls) as pool:
            futs = [_background(pool, cluster[0].url, f"q10-r{i}/c0", n) for i in range(calls)]
            time.sleep(0.3)
            proxy.add_engine(cluster[1]["e0"].url, cell=0, name="e0")
            _wait(lambda: _in_flight(proxy)["e0"] == calls)
            proxy.add_engine(cluster[1]["e1"].url, cell=1, name="e1")
            _wait(lambda: _in_flight(proxy)["e0"] == calls // 2)
            engines["e0"].resume()
            results = [f.result(60) for f in futs]
    finally:
        engines["e0"].resume()
        for i, name in enumerate(("e0", "e1")):
            proxy.add_engine(cluster[1][name].url, cell=i, name=name)
    assert all(r.output_ids == reference for r in results)  # a moved call is as if never moved
    served = sorted(r.meta_info["proxy"]["engines"] for r in results)
    assert served == ["e0"] * (calls // 2) + ["e1"] * (calls // 2), served  # paused: nothing generated on e0
    events = _new_events(cluster, since)
    (rebalance,) = [e for e in events if e["event"] == "rebalance"]
    assert rebalance["engine"] == "e1" and rebalance["moving"] == calls // 2
    moves = [e for e in events if e["event"] == "move"]
    assert len(moves) == calls // 2 and all(m["reason"] == "rebalance" and m["to_engine"] == "e1" for m in moves)
    assert proxy.stats()["runs_lost"] == 0
    _flush(proxy, tmp_path, [f"q10-r{i}" for i in range(calls)])


def test_killing_an_engine_mid_generation_loses_no_call(cluster, proxy, engines, tmp_path):
    """Runs last: e1's process is killed (SIGKILL by PID) while calls run on both engines."""
    n = 240  # long enough that e1's calls are still mid-generation when it is paused, on a loaded machine
    prompts = {f"q8-r{i}": PROMPT + [i] for i in range(4)}
    reference = {run: engines["e0"].generate(p, {"max_new_tokens": n, **GREEDY}).output_ids
                 for run, p in prompts.items()}
    since = len(read_events(cluster[2]))
    victim = cluster[1]["e1"]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futs = {run: _background(pool, cluster[0].url, f"{run}/c0", n, p) for run, p in prompts.items()}
        loads = _wait(lambda: _all_in_flight(proxy, len(prompts)))
        on_victim = loads["e1"]
        assert on_victim >= 1 and loads["e0"] >= 1  # least-loaded spreads the four new runs
        # Every call the proxy sent e1 is admitted into its batch (not still waiting, as on a slow
        # machine) and generating, so that the kill lands mid-generation.
        _wait(lambda: engines["e1"].loads().running == on_victim)
        before = _generated(engines["e1"])
        _wait(lambda: _generated(engines["e1"]) > before)
        engines["e1"].pause("in_place")  # its calls are mid-generation when it dies
        assert engines["e1"].loads().running == on_victim, "e1's calls finished before the pause"
        os.kill(victim.pid, signal.SIGKILL)
        results = {run: f.result(90) for run, f in futs.items()}
    victim.process.wait(10)
    assert all(r.output_ids == reference[run] and r.finish_reason == "length" for run, r in results.items())
    events = _new_events(cluster, since)
    (dead,) = [e for e in events if e["event"] == "engine_dead"]
    assert dead["engine"] == "e1" and "no answer" in dead["reason"]
    moves = [e for e in events if e["event"] == "move"]
    assert len(moves) == on_victim and all(m["reason"] == "dead" and m["to_engine"] == "e0" for m in moves)
    assert not [e for e in events if e["event"] == "call_lost"]
    stats = proxy.stats()
    assert stats["runs_lost"] == 0 and stats["calls_lost"] == 0
    assert {e["name"]: e["state"] for e in stats["engines"]} == {"e0": "active", "e1": "dead"}
    log = _flush(proxy, tmp_path, sorted(prompts))
    assert len(log.calls) == 4 and {c.engine for c in log.calls} <= {"e0", "e1>e0"}
    proxy.remove(engine="e1")
    assert [e["name"] for e in proxy.engines()] == ["e0"]
