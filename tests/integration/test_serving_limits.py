"""Every HTTP listener's guard (gyre_hpc/net/serving.py), tried on a real proxy process with small limits.

Authentication: every route of the proxy is called without a token, with a wrong one, and with an agent's run key
(which reaches only its own run's calls). Limits: a slow request head (slowloris), a slow body, bodies over the
size limit (declared and chunked), deeply nested JSON, and more connections from one client than the cap.
Waits are on conditions with deadlines, never fixed sleeps.
"""
from __future__ import annotations

import os
import socket
import time

import httpx
import pytest

from gyre_hpc.net import auth
from gyre_hpc.config import HttpConfig, ProxyConfig
from gyre_hpc.engines.launch import on_free_port
from gyre_hpc.proxy.launch import start_proxy
from gyre_hpc.proxy.server import ProxyServer
from gyre_hpc.proxy.service import ProxyService

pytestmark = [pytest.mark.slow]

LIMITS = HttpConfig(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=30.0, max_body_bytes=4096,
                    max_json_depth=8, max_connections_per_client=3)


def _start(tmp_path, limits: HttpConfig = LIMITS):
    cfg = ProxyConfig(http=limits, tito_dir=str(tmp_path / "tito"), event_log=str(tmp_path / "events.jsonl"))
    return on_free_port(start_proxy, cfg, log_path=tmp_path / "proxy.log", config_dir=tmp_path)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    handle = _start(tmp_path_factory.mktemp("guarded"))
    try:
        yield handle
    finally:
        handle.stop()


def _routes() -> list[tuple[str, str]]:
    app = ProxyServer(ProxyService(ProxyConfig())).app
    return sorted((method, r.path) for r in app.routes if r.path.startswith("/") and not r.path.startswith(
        ("/docs", "/openapi", "/redoc")) for method in r.methods if method != "HEAD")


def _secret() -> str:
    return os.environ[auth.ENV]


def _raw(proxy) -> socket.socket:
    host, port = proxy.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10.0)


def _read_until_closed(sock: socket.socket, deadline_s: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (a deadline, not a sleep)."""
    sock.settimeout(deadline_s)
    data = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not part:
            return data
        data += part


def test_every_route_answers_401_without_the_secret_or_with_a_wrong_one(proxy):
    routes = _routes()
    assert len(routes) >= 13  # every route of the proxy, found in its own app
    with httpx.Client(base_url=proxy.url, timeout=10.0) as c:
        for method, path in routes:
            for headers in ({}, auth.bearer("wrong"), auth.bearer(_secret() + "x"), {"Authorization": _secret()}):
                resp = c.request(method, path, headers=headers, json={})
                assert resp.status_code == 401, (method, path, headers, resp.text)
                assert "credentials" in resp.json()["error"]["message"]
        assert c.get("/health", headers=auth.bearer(_secret())).status_code == 200


def test_a_run_key_reaches_only_its_own_runs_calls(proxy):
    key = auth.bearer(auth.run_key(_secret(), "q7-r0"))
    with httpx.Client(base_url=proxy.url, timeout=10.0, headers=key) as c:
        for method, path in _routes():
            if path not in ("/generate", "/abort_request", "/tito/outcome") and not path.startswith(("/runs/", "/v1/")):
                assert c.request(method, path, json={}).status_code == 403, path
        assert c.get("/runs/q7-r0/v1/models").status_code == 200  # its own run's OpenAI endpoint
        assert c.get("/runs/q7-r1/v1/models").status_code == 403
        chat = {"model": "gyre", "messages": [{"role": "user", "content": "hi"}]}
        assert c.post("/runs/q7-r1/v1/chat/completions", json=chat).status_code == 403
        assert c.post("/v1/chat/completions", json=chat, headers={"X-Gyre-Run-Id": "q7-r1"}).status_code == 403
        other = c.post("/tito/outcome", json={"run_id": "q7-r1", "status": "scored", "score": 1.0})
        assert other.status_code == 403 and "not run 'q7-r1'" in other.json()["error"]["message"]
        assert c.post("/abort_request", json={"abort_all": True}).status_code == 403
        assert c.post("/abort_request", json={"rid": "q7-r1/c0"}).status_code == 403
        assert c.post("/generate", json={"rid": "q8-r0/c0", "input_ids": [1]}).status_code == 403
        assert c.post("/abort_request", json={"rid": "q7-r0/c0"}).json() == {"aborted": 0}
        own = c.post("/tito/outcome", json={"run_id": "q7-r0", "status": "scored", "score": 1.0})
        assert own.status_code == 200, own.text


def test_a_request_head_sent_too_slowly_is_cut_off(proxy):
    with _raw(proxy) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        t0 = time.monotonic()
        assert _read_until_closed(sock) == b""
    assert time.monotonic() - t0 < 9.0  # closed by the 1 s head deadline, not by the client's own deadline


def test_an_idle_connection_that_never_sends_a_head_is_cut_off(proxy):
    with _raw(proxy) as sock:
        assert _read_until_closed(sock) == b""


def test_a_body_sent_too_slowly_gets_408(proxy):
    with _raw(proxy) as sock:
        sock.sendall(b"POST /tito/outcome HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\nAuthorization: Bearer " + _secret().encode() + b"\r\n\r\n{\"run")
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"http.body_timeout_s" in answer


def test_bodies_over_the_limit_get_413_declared_or_chunked(proxy):
    big = b"x" * (LIMITS.max_body_bytes + 1)
    with httpx.Client(base_url=proxy.url, timeout=10.0, headers=auth.bearer(_secret())) as c:
        declared = c.post("/generate", content=big)
        assert declared.status_code == 413 and "http.max_body_bytes" in declared.json()["error"]["message"]
        chunked = c.post("/generate", content=iter([big[:3000], big[3000:]]))
        assert chunked.status_code == 413
        assert c.get("/health").status_code == 200  # the limit refused those bodies, not the client


def test_json_nested_deeper_than_the_limit_is_a_400_not_a_500(proxy):
    with httpx.Client(base_url=proxy.url, timeout=10.0, headers=auth.bearer(_secret())) as c:
        for depth in (9, 2000):
            resp = c.post("/tito/outcome", content=b"[" * depth + b"]" * depth)
            assert resp.status_code == 400 and f"nested {depth} levels" in resp.json()["error"]["message"]
        flat = c.post("/tito/outcome", content=b'{"run_id": "[[[[[[[[[[", "status": "bad", "score": 1}')
        assert flat.status_code == 400 and "status" in flat.json()["error"]["message"]  # brackets in strings count not


def test_one_client_holds_at_most_the_capped_number_of_connections(tmp_path):
    handle = _start(tmp_path)
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + _secret().encode() + b"\r\n\r\n"
    held: list[socket.socket] = []
    try:
        for _ in range(LIMITS.max_connections_per_client):
            sock = _raw(handle)
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # kept alive: it stays open
            held.append(sock)
        with _raw(handle) as extra:
            extra.sendall(request)
            assert _read_until_closed(extra) == b""  # closed without an answer
        held.pop().close()
        deadline = time.monotonic() + 10.0
        while True:  # the server notices the close asynchronously: a new connection is served once it has
            with _raw(handle) as again:
                again.sendall(request)
                if again.recv(65536).startswith(b"HTTP/1.1 200"):  # b"" when closed at once
                    break
            assert time.monotonic() < deadline, "a freed connection slot was never reused"
    finally:
        for sock in held:
            sock.close()
        handle.stop()
