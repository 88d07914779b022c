"""Issue 16: a group's TITO file lost a run's outcome when the harness's outcome post met a closing connection.

The runtime's real path, end to end: ``Rollouts`` (the harness behind the proxy) → the real proxy process →
an engine double (a true boundary: an SGLang-protocol app that answers every ``/generate`` at once). Between
the harness and the proxy sits a TCP relay (a true boundary too) that can close a connection the moment an
outcome post starts on it, without forwarding it: what the proxy's uvicorn does to a keep-alive connection it
closes after 5 idle seconds, just as the harness sends the straggler's post on it (the cause measured in a
default run: the lost outcome was always posted ~5 s after the group's previous post). Dropping by count is
deterministic; nothing here waits on a clock except for bounded ``Event.wait`` on the group.
"""
import asyncio
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from gyre_hpc.config import load_config
from gyre_hpc.engines.launch import free_port, on_free_port
from gyre_hpc.engines.protocol import generate_response
from gyre_hpc.proxy.client import ProxyClient
from gyre_hpc.proxy.launch import start_proxy
from gyre_hpc.live.rollouts import Rollouts
from gyre_hpc.trajectory.records import read_tito

pytestmark = [pytest.mark.engine]

RUNS = 4


class EngineDouble:
    """Answers every ``/generate`` with ``max_new_tokens`` tokens of policy version 0."""

    def __init__(self):
        app = FastAPI()
        app.add_api_route("/generate", self.generate, methods=["POST"])
        app.add_api_route("/abort_request", lambda: Response(), methods=["POST"])
        app.add_api_route("/health", lambda: Response(), methods=["GET"])
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    async def generate(self, request: Request):
        body = await request.json()
        n, ids = body["sampling_params"]["max_new_tokens"], body["input_ids"]
        out = [1 + (len(ids) + i) % 200 for i in range(n)]
        return generate_response(body["rid"], len(ids), out, [-0.5] * n, ["0"] * n, "0",
                                 {"type": "length", "length": n}, 0.001)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


class Relay:
    """TCP relay to ``upstream``; closes the client's connection, forwarding nothing of it, when an outcome
    post whose number is in ``drop`` (1-based, in the order they reach the relay) starts on it."""

    def __init__(self, upstream_port: int, drop):
        self.upstream_port, self.drop = upstream_port, drop
        self.posts = self.dropped = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _serve(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()

    async def _client(self, reader, writer):
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        back = asyncio.ensure_future(self._pipe(up_reader, writer))
        try:
            while data := await reader.read(65536):
                for _ in range(data.count(b"POST /tito/outcome")):
                    self.posts += 1
                    if self.drop(self.posts):
                        self.dropped += 1
                        return  # close both sides: the client's request gets no answer
                up_writer.write(data)
                await up_writer.drain()
        finally:
            back.cancel()
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    async def _pipe(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def group_run(tmp_path):
    """Run one group through Rollouts behind the relay; returns (group, rollouts, proxy stats, proxy events)."""
    made = []

    def run(drop):
        cfg = load_config("configs/local.yaml", [f"agent.runs_per_group={RUNS}", "agent.tool_time_median_s=0.001",
                                                 f"run.out_dir={tmp_path}",
                                                 f"proxy.tito_dir={tmp_path / 'tito'}"])
        engine = EngineDouble()
        made.append(engine.stop)
        proxy = on_free_port(start_proxy, cfg.proxy, [(0, engine.url)], log_path=tmp_path / "proxy.log",
                             config_dir=tmp_path)
        made.append(proxy.stop)
        relay = Relay(int(proxy.url.rsplit(":", 1)[1]), drop)
        made.append(relay.stop)
        offered, done = [], threading.Event()
        rollouts = Rollouts(tmp_path, relay.url, lambda g: (offered.append(g), done.set()), agent=cfg.agent,
                            grader=cfg.grader, model=cfg.model, engine=cfg.engine, trajectory=cfg.trajectory,
                            seed=cfg.run.seed, cells=cfg.cluster.cells, batch_groups=cfg.scheduler.batch_groups)
        made.append(rollouts.stop)
        assert rollouts.admit(1) == 1
        assert done.wait(120), "the group never became ready"
        with ProxyClient(proxy.url) as pc:
            stats, events = pc.stats(), pc.events()
        return offered[0], rollouts, stats, events, relay

    yield run
    for stop in reversed(made):
        stop()


def test_an_outcome_post_dropped_by_a_closing_connection_is_sent_again_and_the_group_builds(group_run):
    group, rollouts, stats, events, relay = group_run(lambda n: n == RUNS)  # the straggler's post
    assert rollouts.errors == []  # before the fix: "run q0-rN has calls but no outcome record (unfinished)"
    log = read_tito(rollouts.tito_path(group.gid))
    assert sorted(o.run_id for o in log.outcomes) == [f"q0-r{i}" for i in range(RUNS)]
    assert rollouts.groups[0]["lost"] is None
    assert relay.dropped == 1 and relay.posts == RUNS + 1  # its retry went through
    assert len(rollouts.groups[0]["rewards"]) == RUNS
    assert stats["outcomes_recovered"] == 0  # the post itself got through


def test_a_run_whose_outcome_post_never_arrives_still_has_its_one_outcome_in_the_group_file(group_run):
    group, rollouts, stats, events, relay = group_run(lambda n: True)  # every outcome post is lost
    assert rollouts.errors == []
    log = read_tito(rollouts.tito_path(group.gid))
    assert sorted(o.run_id for o in log.outcomes) == [f"q0-r{i}" for i in range(RUNS)]  # exactly one each
    assert rollouts.groups[0]["lost"] is None and relay.dropped >= RUNS
    assert stats["outcomes_recovered"] == RUNS  # the group's flush brought them
    assert sorted(e["run_id"] for e in events if e["event"] == "outcome_recovered") == \
        [f"q0-r{i}" for i in range(RUNS)]
