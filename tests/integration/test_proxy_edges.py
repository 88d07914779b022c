"""Proxy edge cases against fake SGLang-protocol engines (a true boundary: engines that misbehave on purpose).

The real-engine behaviour is in test_proxy.py; here each fake engine is a small FastAPI app on 127.0.0.1 (uvicorn
in a thread) that answers ``/generate`` the way one edge case needs: it aborts every request on its own, it is
overloaded (503), or it is slow. The proxy runs in-process (its real FastAPI app through TestClient).
"""
import asyncio
import concurrent.futures
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.testclient import TestClient

from gyre_hpc.config import ProxyConfig
from gyre_hpc.engines.launch import free_port
from gyre_hpc.engines.protocol import error_body, generate_response
from gyre_hpc.proxy.events import proxy_log
from gyre_hpc.proxy.server import ProxyServer
from gyre_hpc.proxy.service import ProxyService
from gyre_hpc.trajectory.records import read_tito

pytestmark = [pytest.mark.engine]


class FakeEngine:
    """``mode``: "ok" (whole answer), "abort" (one token, then an abort it was not asked for), "busy" (503),
    "reject" (400), "slow" (answers after ``delay`` s unless the caller hangs up first)."""

    def __init__(self, mode: str, delay: float = 5.0):
        self.mode, self.delay, self.seen, self.hung_up = mode, delay, [], 0
        app = FastAPI()
        app.add_api_route("/generate", self.generate, methods=["POST"])
        app.add_api_route("/abort_request", lambda: Response(), methods=["POST"])
        app.add_api_route("/health", lambda: Response(), methods=["GET"])
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "fake engine did not start"
            time.sleep(0.01)

    async def generate(self, request: Request):
        body = await request.json()
        self.seen.append(body)
        n, ids = body["sampling_params"]["max_new_tokens"], body["input_ids"]
        if self.mode == "busy":
            return JSONResponse(error_body("engine overloaded: 9 requests waiting"), 503)
        if self.mode == "reject":
            return JSONResponse(error_body("sampling_params.temprature: unknown sampling parameter"), 400)
        if self.mode == "slow":
            for _ in range(int(self.delay / 0.05)):
                if await request.is_disconnected():
                    self.hung_up += 1
                    return Response(status_code=499)
                await asyncio.sleep(0.05)
        out = [len(ids) % 200] if self.mode == "abort" else [1 + i % 200 for i in range(n)]
        finish = {"type": "abort", "message": "engine restarting"} if self.mode == "abort" else \
            {"type": "length", "length": n}
        return generate_response(body["rid"], len(ids), out, [-0.5] * len(out), ["2"] * len(out), "2", finish, 0.01)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def fakes():
    made = []

    def make(mode, **kw):
        made.append(FakeEngine(mode, **kw))
        return made[-1]
    yield make
    for f in made:
        f.stop()


@pytest.fixture
def proxy_app(tmp_path):
    """A proxy whose config a test may change: ``proxy_app(**cfg)`` → (TestClient, service)."""
    clients = []

    def make(**cfg):
        service = ProxyService(ProxyConfig(**{"no_engine_wait_s": 0.5, "abort_retry_s": 0.01,
                                              "tito_dir": str(tmp_path / "tito"), **cfg}),
                               events=proxy_log(tmp_path / "events.jsonl"))
        client = TestClient(ProxyServer(service).app)
        client.__enter__()
        clients.append(client)
        return client, service
    yield make
    for c in clients:
        c.__exit__(None, None, None)


def gen(client, rid, n=4, **kw):
    return client.post("/generate", json={"input_ids": [1, 2, 3], "rid": rid,
                                          "sampling_params": {"max_new_tokens": n}, **kw})


def test_an_overloaded_engine_sends_the_call_to_another(fakes, proxy_app):
    busy, ok = fakes("busy"), fakes("ok")
    client, service = proxy_app()
    client.post("/admin/engines", json={"url": busy.url, "cell": 0, "name": "busy"})
    client.post("/admin/engines", json={"url": ok.url, "cell": 1, "name": "ok"})
    resp = gen(client, "q0-r0/c0", n=4)
    assert resp.status_code == 200 and resp.json()["output_ids"] == [1, 2, 3, 4]
    (move,) = service.events.of("move")
    assert (move["reason"], move["from_engine"], move["to_engine"]) == ("refused (503)", "busy", "ok")
    assert len(busy.seen) == 1 and len(ok.seen) == 1


def test_an_engine_refusal_other_than_overload_reaches_the_harness_unchanged(fakes, proxy_app):
    client, service = proxy_app()
    picky = fakes("reject")
    client.post("/admin/engines", json={"url": picky.url, "cell": 0})
    resp = gen(client, "q0-r0/c0")
    assert resp.status_code == 400 and "sampling_params.temprature" in resp.json()["error"]["message"]
    assert not service.events.of("move") and service.recorder.pending()["calls"] == 0
    resp = gen(client, "q0-r0/c1", n=-1)  # checked by the proxy itself: never reaches the engine
    assert resp.status_code == 400 and "sampling_params.max_new_tokens" in resp.json()["error"]["message"]
    assert len(picky.seen) == 1


def test_a_call_moved_more_than_max_moves_per_call_is_lost_logged_and_counted(fakes, proxy_app):
    client, service = proxy_app(max_moves_per_call=3)
    for i, eng in enumerate((fakes("abort"), fakes("abort"))):
        client.post("/admin/engines", json={"url": eng.url, "cell": i, "name": f"a{i}"})
    resp = gen(client, "q0-r0/c0", n=50)
    assert resp.status_code == 502 and "lost: moved 3 times" in resp.json()["error"]["message"]
    (lost,) = service.events.of("call_lost")
    assert lost["rid"] == "q0-r0/c0" and lost["moves"] == 3 and lost["output_tokens"] == 4
    moves = service.events.of("move")
    assert [m["reason"] for m in moves] == ["engine_abort"] * 3
    assert [m["reprefill_tokens"] for m in moves] == [4, 5, 6]  # prompt 3 + 1, + 2, + 3 partial tokens
    stats = client.get("/admin/stats").json()
    assert (stats["calls_lost"], stats["runs_lost"], stats["tito_pending"]["calls"]) == (1, 1, 0)
    assert all(e["in_flight"] == 0 for e in stats["engines"])


def test_each_continuation_asks_for_the_tokens_still_missing(fakes, proxy_app):
    client, service = proxy_app(max_moves_per_call=8)
    flaky = fakes("abort")
    client.post("/admin/engines", json={"url": flaky.url, "cell": 0, "name": "flaky"})
    ok = fakes("ok")
    client.post("/admin/engines", json={"url": ok.url, "cell": 1, "name": "ok"})
    resp = gen(client, "q1-r0/c0", n=10)  # all idle: the engine added first (flaky) takes it
    assert resp.status_code == 200
    first = flaky.seen[-1]
    cont = ok.seen[-1]
    assert cont["input_ids"] == first["input_ids"] + [3] and cont["sampling_params"]["max_new_tokens"] == 9
    assert resp.json()["output_ids"] == [3] + [1 + i for i in range(9)]
    assert resp.json()["meta_info"]["proxy"] == {"engines": "flaky>ok", "moves": 1}


def test_a_harness_that_hangs_up_cancels_its_call_and_nothing_is_recorded(fakes, proxy_app, tmp_path):
    slow = fakes("slow", delay=10.0)
    client, service = proxy_app()
    client.post("/admin/engines", json={"url": slow.url, "cell": 0})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(ProxyServer(service).app, host="127.0.0.1", port=port,
                                           log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/generate", timeout=0.5,
                       json={"input_ids": [1], "rid": "q0-r0/c0", "sampling_params": {"max_new_tokens": 3}})
        deadline = time.monotonic() + 10
        while not (slow.hung_up and not service.stats()["calls_in_flight"]):
            assert time.monotonic() < deadline, "the call was not cancelled"
            time.sleep(0.05)
    finally:
        server.should_exit = True
        thread.join(10)
    assert service.events.of("call_cancelled")[0]["rid"] == "q0-r0/c0"
    assert service.recorder.pending() == {"calls": 0, "outcomes": 0}
    assert service.router.engines()[0].load == 0


def test_no_engine_at_all_is_a_503_after_the_wait(proxy_app):
    client, _ = proxy_app(no_engine_wait_s=0.2)
    t0 = time.monotonic()
    resp = gen(client, "q0-r0/c0")
    assert resp.status_code == 503 and "no ACTIVE rollout engine" in resp.json()["error"]["message"]
    assert time.monotonic() - t0 >= 0.2


@pytest.mark.parametrize("path,body,status,message", [
    ("/admin/drain", {}, 400, "give exactly one of 'engine'"),
    ("/admin/drain", {"engine": "nope"}, 404, "unknown engine 'nope'"),
    ("/admin/drain", {"cell": "0"}, 400, "cell: expected a cell index"),
    ("/admin/dead", {"cell": 5}, 404, "no engine is registered for cell 5"),
    ("/admin/remove", {"engine": "e", "force": True}, 400, "force: unknown key"),
    ("/admin/engines", {"url": "http://127.0.0.1:1"}, 400, "cell: missing"),
    ("/admin/engines", {"url": "", "cell": 0}, 400, "url: expected a non-empty string"),
    ("/admin/flush_tito", {"name": "x.jsonl", "run_ids": "q0-r0"}, 400, "run_ids: expected a list"),
    ("/admin/flush_tito", {"path": "/etc/x"}, 400, "path: unknown key; valid keys: name, run_ids"),
    ("/admin/flush_tito", {"name": "../../etc/cron.d/x.jsonl"}, 400, "name: expected a file name"),
    ("/admin/flush_tito", {"name": "/etc/passwd"}, 400, "name: expected a file name"),
    ("/tito/outcome", {"run_id": "q0-r0", "status": "passed", "score": 1}, 400, "status: 'passed' is not one of"),
    ("/tito/outcome", {"run_id": "q0-r0", "status": "eval_failure", "score": 0}, 400, "score null"),
    ("/abort_request", {"rid": "x", "all": True}, 400, "all: unknown key"),
])
def test_bad_admin_requests_name_the_key_in_sglangs_error_shape(proxy_app, path, body, status, message):
    client, _ = proxy_app()
    resp = client.post(path, json=body)
    assert resp.status_code == status and message in resp.json()["error"]["message"]


def test_outcomes_posted_to_the_proxy_are_flushed_with_the_calls(fakes, proxy_app, tmp_path):
    client, _ = proxy_app()
    client.post("/admin/engines", json={"url": fakes("ok").url, "cell": 0})
    assert gen(client, "q0-r0/c0").status_code == 200
    again = gen(client, "q0-r0/c0")
    assert again.status_code == 409 and "already sent" in again.json()["error"]["message"]
    assert gen(client, "q0-r1/c0", query_id="q0").status_code == 200
    assert client.post("/tito/outcome", json={"run_id": "q0-r0", "status": "scored", "score": 0.0}).status_code == 200
    assert client.post("/tito/outcome", json={"run_id": "q0-r1", "status": "eval_failure", "score": None,
                                              "detail": "grader crashed"}).status_code == 200
    path = tmp_path / "tito" / "step-0.jsonl"
    flushed = client.post("/admin/flush_tito", json={"name": path.name}).json()
    assert (flushed["calls"], flushed["outcomes"], flushed["runs"]) == (2, 2, ["q0-r0", "q0-r1"])
    log = read_tito(path)
    assert [c.output_ids.tolist() for c in log.calls] == [[1, 2, 3, 4]] * 2
    assert log.outcome["q0-r1"].score is None and log.outcome["q0-r0"].score == 0.0
    assert log.calls[0].output_versions.tolist() == [2, 2, 2, 2] and log.calls[0].engine.startswith("http://")


def test_a_harness_abort_ends_a_call_that_waits_for_an_engine(proxy_app):
    client, service = proxy_app(no_engine_wait_s=30.0)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(gen, client, "q0-r0/c0")
        deadline = time.monotonic() + 10
        while not service.stats()["calls_in_flight"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.monotonic()
        assert client.post("/abort_request", json={"rid": "q0-r0/c0"}).json() == {"aborted": 1}
        resp = fut.result(10)
    assert time.monotonic() - t0 < 5
    assert resp.status_code == 200 and resp.json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert resp.json()["output_ids"] == [] and not service.events.of("call_lost")
