"""proxy.mover: kv in front of two real local engines with engine.kv_cache: a drained call's KV blocks move to the
target over Mooncake (loopback TCP) and its greedy tokens equal the unmoved ones; every failure falls back to
re-prefill with its reason logged (kv_fallback), and no call is lost.

One proxy and two engine processes per module; tests that drain, relabel or remove an engine undo it. The test
whose target dies mid-transfer uses a double at the true boundary: a listener that drops /kv/import and stops
listening (an engine process killed while the transfer runs)."""
import concurrent.futures
import socket
import threading
import time

import httpx
import pytest

from gyre_hpc.net import auth
from gyre_hpc.config import EngineConfig, ModelConfig, ProxyConfig
from gyre_hpc.engines.launch import on_free_port, start_local_engine
from gyre_hpc.proxy.client import ProxyClient
from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.proxy.launch import start_proxy

pytestmark = [pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

MODEL = ModelConfig()
ENGINE = EngineConfig(max_running_requests=8, context_len=256, request_timeout_s=120.0, kv_cache=True,
                      kv_block_size=4, kv_pool_tokens=4096,
                      device_tick_s=0.01)  # a call of N tokens lasts >= 2 s: it is still running when drained
PROMPT = [5, 17, 42, 99, 3]
GREEDY = {"temperature": 0.0}
N = 200


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kvmove")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(on_free_port, start_local_engine, ENGINE, MODEL, seed=0,
                               log_path=tmp / f"engine{i}.log") for i in range(2)]
        engines = {f"e{i}": f.result() for i, f in enumerate(futures)}
    events = tmp / "events.jsonl"
    cfg = ProxyConfig(event_log=str(events), no_engine_wait_s=30.0, request_timeout_s=120.0, health_timeout_s=1.0,
                      connect_retries=0)
    assert cfg.mover == "kv"  # the default
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
        time.sleep(0.01)
    return value


def _generated(client) -> int:
    return int(client._http.get("/server_info").json()["generated_tokens"])


def _in_flight(proxy) -> dict:
    return {e["name"]: e["in_flight"] for e in proxy.engines() if e["state"] == "active"}


def _drained_call(cluster, proxy, engines, rid, before_drain=lambda source: None):
    """A greedy call of N tokens, drained off its engine after >= 12 tokens; returns (answer, source, events)."""
    since = len(read_events(cluster[2]))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        def call():
            with ProxyClient(cluster[0].url, timeout=120.0) as c:
                return c.generate(PROMPT, rid, {"max_new_tokens": N, **GREEDY})
        fut = pool.submit(call)
        source = _wait(lambda: next((n for n, k in _in_flight(proxy).items() if k), None))
        before = _generated(engines[source])
        _wait(lambda: _generated(engines[source]) >= before + 12)
        engines[source].pause("in_place")
        try:
            before_drain(source)
            proxy.drain(engine=source)
            res = fut.result(120)
        finally:
            engines[source].resume()
    proxy.add_engine(cluster[1][source].url, cell=int(source[1]), name=source)
    return res, source, read_events(cluster[2])[since:]


def test_a_drained_call_moves_its_kv_blocks_and_continues_with_the_unmoved_tokens(cluster, proxy, engines):
    reference = engines["e0"].generate(PROMPT, {"max_new_tokens": N, **GREEDY}).output_ids
    res, source, events = _drained_call(cluster, proxy, engines, "q1-r0/c0")
    assert res.output_ids == reference and res.finish_reason == "length"
    (move,) = [e for e in events if e["event"] == "move"]
    (kv,) = [e for e in events if e["event"] == "kv_move"]
    assert move["kind"] == "kv" and move["moved_tokens"] == kv["moved_tokens"] > 0 and kv["bytes"] > 0
    assert move["reprefill_tokens"] == len(PROMPT) + move["partial_tokens"] - move["moved_tokens"] <= 4
    stats = proxy.stats()
    assert stats["runs_moved_kv"] >= 1 and stats["moves_kv"] >= 1 and stats["runs_lost"] == 0


def test_a_target_serving_other_weights_gets_a_logged_fallback_and_the_same_tokens(cluster, proxy, engines):
    reference = engines["e0"].generate(PROMPT, {"max_new_tokens": N, **GREEDY}).output_ids
    relabelled = []

    def relabel(source):
        target = "e1" if source == "e0" else "e0"
        engines[target].update_weight_version("7")  # same weights, another label: the blocks are refused
        relabelled.append(target)
    try:
        res, source, events = _drained_call(cluster, proxy, engines, "q2-r0/c0", relabel)
    finally:
        for t in relabelled:
            engines[t].update_weight_version("0")
    assert res.output_ids == reference
    (fb,) = [e for e in events if e["event"] == "kv_fallback"]
    (move,) = [e for e in events if e["event"] == "move"]
    assert fb["reason"] == "version_mismatch" and move["kind"] == "reprefill" and move["moved_tokens"] == 0


def test_an_engine_refuses_a_corrupt_bundle_as_a_checksum_mismatch(cluster, engines):
    tokens = PROMPT + list(engines["e0"].generate(PROMPT, {"max_new_tokens": 20, **GREEDY}).output_ids)
    head = auth.bearer(auth.job_secret())
    src, dst = (cluster[1][n].url for n in ("e0", "e1"))
    desc = httpx.post(f"{src}/kv/export", json={"tokens": tokens}, headers=head, timeout=60).json()
    assert desc["nbytes"] > 0 and len(desc["tokens"]) == (len(tokens) - 1) // 4 * 4
    spoiled = {**desc, "checksum": "0" * 32}
    resp = httpx.post(f"{dst}/kv/import", json={"descriptor": spoiled}, headers=head, timeout=60)
    assert resp.status_code == 409 and resp.json()["error"]["reason"] == "checksum_mismatch"
    ok = httpx.post(f"{dst}/kv/import", json={"descriptor": desc}, headers=head, timeout=60).json()
    assert ok["moved_tokens"] == len(desc["tokens"]) and ok["bytes"] == desc["nbytes"]
    assert httpx.post(f"{src}/kv/release", json={"move_id": desc["move_id"]}, headers=head).json()["released"]
    assert httpx.post(f"{src}/kv/export", json={"tokens": tokens}).status_code == 401  # authenticated


class _DyingTarget:
    """A double of an engine that dies during the KV transfer: answers /health, then drops /kv/import's connection
    and stops listening."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = conn.recv(65536)
                if b"/kv/import" in head.split(b"\r\n", 1)[0]:
                    self.sock.close()  # died: later connections are refused
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")


def test_a_target_that_dies_mid_transfer_loses_no_call(cluster, proxy, engines):
    """Last: it removes e1 and brings it back."""
    reference = engines["e0"].generate(PROMPT, {"max_new_tokens": N, **GREEDY}).output_ids
    proxy.remove(engine="e1")
    dying = _DyingTarget()
    since = len(read_events(cluster[2]))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        def call():
            with ProxyClient(cluster[0].url, timeout=120.0) as c:
                return c.generate(PROMPT, "q3-r0/c0", {"max_new_tokens": N, **GREEDY})
        fut = pool.submit(call)
        _wait(lambda: _in_flight(proxy).get("e0") == 1)
        before = _generated(engines["e0"])
        _wait(lambda: _generated(engines["e0"]) >= before + 12)
        engines["e0"].pause("in_place")
        try:
            proxy.add_engine(dying.url, cell=5, name="dx")  # the only target
            with concurrent.futures.ThreadPoolExecutor(1) as drainer:
                drained = drainer.submit(proxy.drain, engine="e0")
                _wait(lambda: {e["name"]: e["state"] for e in proxy.engines()}.get("dx") == "dead")
                proxy.add_engine(cluster[1]["e1"].url, cell=1, name="e1")  # the call continues here
                drained.result(120)
            res = fut.result(120)
        finally:
            engines["e0"].resume()
    proxy.add_engine(cluster[1]["e0"].url, cell=0, name="e0")
    proxy.remove(engine="dx")
    assert res.output_ids == reference and res.finish_reason == "length"
    events = read_events(cluster[2])[since:]
    fallbacks = [e["reason"] for e in events if e["event"] == "kv_fallback"]
    assert fallbacks[0] == "transfer_error" and set(fallbacks) <= {"transfer_error", "source_dead"}
    moves = [e for e in events if e["event"] == "move"]
    assert [m["to_engine"] for m in moves][-1] == "e1" and all(m["kind"] == "reprefill" for m in moves)
    assert proxy.stats()["runs_lost"] == 0
