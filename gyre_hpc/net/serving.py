"""Shared plumbing of the HTTP service processes (the local engine, the proxy); edge: uvicorn/FastAPI.

Invariants
- The ready line is printed (and flushed) only after the server accepts connections; launchers
  (``engines.launch``, ``proxy.launch``) wait for it before they hand out the URL.
- A service ignores SIGUSR1, the preemption signal of a live run (on submitit's tasks the time-limit signal too:
  ``rank_signals.service_ignored``): under SLURM a signal to the step reaches every
  process in it, and the ranks (``live.preempt``), not their services, decide what preemption does.
- A request whose caller hangs up is given up within ``DISCONNECT_POLL_S`` (its work is aborted or cancelled
  by the caller's ``on_hang_up``) and answered 499, as in SGLang.
- An empty body reads as ``{}``; malformed JSON is the service's own typed error naming line and column.

Security and limits (``make_server`` wraps every listener the same way; tests/integration/test_serving_limits.py)
- Every request must carry the job secret (``gyre_hpc.net.auth``), or on the proxy a run key for its run routes
  (``RUN_ROUTES``); otherwise 401 (403 for a run key outside them) before its body is read.
- A request head not complete within ``http.header_timeout_s`` (slowloris), or a body not complete within
  ``http.body_timeout_s`` (408), closes the connection; a body over ``http.max_body_bytes`` is a 413 (by its
  Content-Length before any byte is read, else once counted); JSON nested deeper than ``http.max_json_depth``
  is the service's 400 (never a RecursionError); one client address holds at most
  ``http.max_connections_per_client`` connections (more are closed at once), the server ``http.max_connections``.
- A service exits on its own within ``PARENT_POLL_S`` once its parent is gone (``watch_parent``): the launchers'
  parent-death signal (``engines.children``) covers what this watchdog cannot (a process that hangs in C code).
"""
from __future__ import annotations

import asyncio
import collections
import inspect
import json
import os
import re
import signal
import sys
import threading
from typing import Any, Awaitable, Callable

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from gyre_hpc.net import auth
from gyre_hpc.clock import wait_until
from gyre_hpc.config import HttpConfig
from gyre_hpc.errors import ConfigError
from gyre_hpc.lifecycle import rank_signals
from gyre_hpc.lifecycle.recovery import ORPHAN_EXIT

DISCONNECT_POLL_S = 0.25
PARENT_POLL_S = 0.5
#: the environment variable a launcher sets to its own PID, so that a child whose parent died before the
#: watchdog started still notices (its ``os.getppid()`` is already another process)
PARENT_ENV = "GYRE_PARENT_PID"
#: the proxy routes an agent's run key may call (each checks that the run is the key's own: ``require_run``)
RUN_ROUTES = ("/generate", "/abort_request", "/tito/outcome")
#: The proxy's OpenAI endpoint: a run key reaches it too, and the route checks the run is its own (``require_run``).
RUN_PREFIXES = ("/runs/", "/v1/")


async def serve_announced(server: Any, ready_line: str) -> None:
    """Run the ``uvicorn.Server`` ``server`` until it exits; print ``ready_line`` once it has started."""
    if threading.current_thread() is threading.main_thread():
        sigs = rank_signals.current()
        for s in sigs.nums(sigs.service_ignored):  # the ranks' preemption signals but SIGTERM (module docstring)
            signal.signal(s, signal.SIG_IGN)
    watch_parent()

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        print(ready_line, flush=True)

    task = asyncio.ensure_future(announce())
    try:
        await server.serve()
    finally:
        task.cancel()


async def read_json(request: Request, error: Callable[[str], Exception]) -> Any:
    """The request's JSON body (``{}`` when empty); invalid JSON raises ``error(message)``."""
    raw = await request.body()
    if not raw.strip():
        return {}
    limit = request.scope.get("gyre.max_json_depth", HttpConfig().max_json_depth)
    depth = json_depth(raw)
    if depth > limit:
        raise error(f"JSON nested {depth} levels deep; at most {limit} (http.max_json_depth)")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise error(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise error(f"JSON nested too deep to parse; at most {limit} levels (http.max_json_depth)") from None


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``raw`` (brackets inside strings do not count);
    linear in the size, without parsing (a parser recurses once per level)."""
    codes = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = (codes == ord("[")).astype(np.int64) + (codes == ord("{")) - (codes == ord("]")) - (codes == ord("}"))
    return int(np.cumsum(steps).max(initial=0))


async def answer_unless_hung_up(request: Request, future: asyncio.Future,
                                on_hang_up: Callable[[], Awaitable[None] | None]) -> Response:
    """``future``'s result as JSON, or 499 after ``on_hang_up()`` if the caller disconnects first."""
    while True:
        done, _ = await asyncio.wait({future}, timeout=DISCONNECT_POLL_S)
        if done:
            return JSONResponse(future.result())
        if await request.is_disconnected():
            result = on_hang_up()
            if inspect.isawaitable(result):
                await result
            return Response(status_code=499)


# ---------------------------------------------------------------------------------------------- parent watchdog
def watch_parent(parent_pid: int | None = None, poll_s: float = PARENT_POLL_S,
                 on_gone: Callable[[], None] | None = None) -> threading.Thread:
    """A daemon thread that calls ``on_gone`` (default: exit at once) when this process's parent is no longer
    ``parent_pid`` (default: ``$GYRE_PARENT_PID``, else the parent now): re-parented, the launcher is dead."""
    parent = parent_pid or int(os.environ.pop(PARENT_ENV, "0") or 0) or os.getppid()

    def gone() -> None:
        print(f"{sys.argv[0]}: parent {parent} is gone; exiting", file=sys.stderr, flush=True)
        os._exit(ORPHAN_EXIT)

    def watch() -> None:
        wait_until(lambda: os.getppid() != parent, None, poll_s=poll_s)
        (on_gone or gone)()

    thread = threading.Thread(target=watch, name="gyre-parent-watchdog", daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------------------------- authentication, bodies
def require_run(request: Request, run_id: str, error: Callable[[str], Exception]) -> None:
    """A request made with a run key may touch only its own run; ``error(message)`` (a 403) otherwise."""
    grant = request.scope.get("gyre.grant")
    if grant is not None and not grant.job and grant.run_id != run_id:
        raise error(f"this key is for run {grant.run_id!r}, not run {run_id!r}")


async def _refuse(send: Callable, status: int, message: str, close: bool = False) -> None:
    body = json.dumps({"error": {"message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware in front of a service: authentication first, then the whole body read under the
    size and time limits, then the request replayed to the service (module docstring)."""

    def __init__(self, app: Any, secret: str, limits: HttpConfig, run_keys: bool = False):
        if not secret:
            raise ConfigError(f"{auth.ENV} is not set: a service never listens without the job secret")
        self.app, self.secret, self.limits, self.run_keys = app, secret, limits, run_keys

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        grant = auth.grant(headers.get(b"authorization", b"").decode("latin-1"), self.secret, self.run_keys)
        if grant is None:
            return await _refuse(send, 401, auth.refusal(headers.get(b"authorization", b"").decode("latin-1"),
                                                         self.run_keys))
        if not grant.job and scope["path"] not in RUN_ROUTES and not scope["path"].startswith(RUN_PREFIXES):
            return await _refuse(send, 403, f"a run key may call only {', '.join(RUN_ROUTES)} and its own run's "
                                            f"OpenAI endpoint (/runs/RUN/v1/...)")
        body = await self._body(headers, receive, send)
        if body is None:
            return
        scope = {**scope, "gyre.grant": grant, "gyre.max_json_depth": self.limits.max_json_depth}
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _body(self, headers: dict, receive: Callable, send: Callable) -> bytes | None:
        """The whole request body, or None after answering 413/408 (or when the client left)."""
        limit = self.limits.max_body_bytes
        declared = headers.get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > limit:
            await _refuse(send, 413, f"body of {int(declared)} bytes; at most {limit} (http.max_body_bytes)", True)
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_s
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                await _refuse(send, 408, f"body not complete after {self.limits.body_timeout_s:g} s "
                                         f"(http.body_timeout_s)", True)
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _refuse(send, 413, f"body over {limit} bytes (http.max_body_bytes)", True)
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)


# ------------------------------------------------------------------------------------------------ connections
def limited_protocol(limits: HttpConfig) -> type:
    """uvicorn's h11 protocol with a request-head deadline and a per-client connection cap (module docstring)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    open_per_client: collections.Counter = collections.Counter()

    class LimitedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _host: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            host = self.client[0] if self.client else ""
            if open_per_client[host] >= limits.max_connections_per_client:
                transport.close()
                return
            self._host = host
            open_per_client[host] += 1
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._host is not None:
                open_per_client[self._host] -= 1
                if open_per_client[self._host] <= 0:
                    del open_per_client[self._host]
                self._host = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:
                self._arm()  # a request head is arriving (on a new or a kept-alive connection)
            else:
                self._disarm()

        def _arm(self) -> None:
            if self._head_timer is None and not self.transport.is_closing():
                self._head_timer = self.loop.call_later(limits.header_timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return LimitedH11Protocol


def make_server(app: Any, host: str, port: int, limits: HttpConfig, secret: str | None = None,
                run_keys: bool = False, server_class: type | None = None) -> Any:
    """The ``uvicorn.Server`` of a service: ``app`` behind ``Guard`` with the job secret (default
    ``$GYRE_JOB_SECRET``), on ``host:port`` only, with the limits of ``limits``."""
    import uvicorn

    secret = secret or auth.job_secret()
    if secret is None:
        raise ConfigError(f"{auth.ENV} is not set: a service never listens without the job secret")
    config = uvicorn.Config(Guard(app, secret, limits, run_keys), host=host, port=port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=5, http=limited_protocol(limits),
                            timeout_keep_alive=limits.keep_alive_s, limit_concurrency=limits.max_connections,
                            h11_max_incomplete_event_size=limits.max_header_bytes)
    return (server_class or uvicorn.Server)(config)
