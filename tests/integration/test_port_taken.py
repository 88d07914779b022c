"""A port ``free_port`` found free can be bound by another process before the started one binds it (a busy machine
running many jobs). That process's ``/health`` then answers for ours: before, the run went on talking to another
job's proxy and hung (CI: a run whose proxy could not possibly be ready in 1 ms ran on for 300 s). A start counts
an answer only from its own process tree (``EngineHandle._listens_on_its_port``); another's is ``PORT_TAKEN``, so
``on_free_port`` tries another port."""
from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gyre_hpc.config import ProxyConfig
from gyre_hpc.engines import launch
from gyre_hpc.engines.client import EngineClient
from gyre_hpc.engines.launch import PORT_TAKEN, on_free_port, spawn_ready
from gyre_hpc.errors import EngineError
from gyre_hpc.proxy.launch import start_proxy

pytestmark = [pytest.mark.slow]


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def someone_elses_server():
    """A server of this (test) process, outside the started process's tree, answering 200 on every path."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_an_answer_from_another_process_on_the_port_fails_the_start_as_port_taken(someone_elses_server, tmp_path):
    port = someone_elses_server
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    never_binds = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(EngineError, match=PORT_TAKEN) as caught:
        spawn_ready(never_binds, f"http://127.0.0.1:{port}", tmp_path / "p.log", timeout_s=30.0, name="proxy")
    assert "another process answers there" in str(caught.value)


def test_the_proxy_starts_on_another_port_when_its_first_was_taken_by_a_server_that_answers(
        someone_elses_server, tmp_path, monkeypatch):
    taken = someone_elses_server
    ports = iter([taken])
    real_free_port = launch.free_port
    monkeypatch.setattr(launch, "free_port", lambda host="127.0.0.1": next(ports, None) or real_free_port(host))
    proxy = on_free_port(start_proxy, ProxyConfig(), log_path=tmp_path / "proxy.log", config_dir=tmp_path)
    try:
        assert not proxy.url.endswith(f":{taken}")
        assert proxy._listens_on_its_port()
        with EngineClient(proxy.url) as client:  # the job secret as its Bearer token
            assert client.health(timeout=10.0)
    finally:
        proxy.stop()
