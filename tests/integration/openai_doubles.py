"""Helpers of the OpenAI-endpoint tests: a scripted SGLang engine double and servers in threads.

``ScriptedEngineDouble`` stands at the engine boundary: it answers ``/generate`` with the token ids of the next
scripted reply (text encoded with the model's tokenizer, then the end-of-turn token), as a model that writes
well-formed tool calls would, and keeps every request it saw. Everything between the ``openai`` client and it is
real: the proxy's FastAPI app (uvicorn, real HTTP), the chat book, the model's tokenizer and chat template.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from gyre_hpc.engines.launch import free_port
from gyre_hpc.engines.protocol import generate_response


class ThreadServer:
    """A uvicorn server for ``app`` on 127.0.0.1 in a daemon thread; ``stop()`` ends it."""

    def __init__(self, app):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class ScriptedEngineDouble:
    """``reply(i, input_ids, run_id) -> list[int]``: the output ids of the run's i-th request (stop included)."""

    def __init__(self, reply: Callable[[int, Sequence[int], str], list[int]], version: str = "3"):
        self.reply, self.version, self.seen = reply, version, []
        app = FastAPI()
        app.add_api_route("/generate", self.generate, methods=["POST"])
        app.add_api_route("/abort_request", lambda: Response(), methods=["POST"])
        app.add_api_route("/health", lambda: Response(), methods=["GET"])
        self.http = ThreadServer(app)
        self.url = self.http.url

    async def generate(self, request: Request):
        body = await request.json()
        ids = body["input_ids"]
        run = body["rid"].rpartition("/")[0]
        i = sum(b["rid"].rpartition("/")[0] == run for b in self.seen)
        out = list(self.reply(i, ids, run))[: body["sampling_params"]["max_new_tokens"]]
        self.seen.append(body)
        stops = set(body["sampling_params"].get("stop_token_ids") or [])
        finish = {"type": "stop", "matched": out[-1]} if out and out[-1] in stops else \
            {"type": "length", "length": len(out)}
        return generate_response(body["rid"], len(ids), out, [-0.25] * len(out), [self.version] * len(out),
                                 self.version, finish, 0.01)

    def stop(self) -> None:
        self.http.stop()
