"""Shared plumbing of the HTTP service processes (the local engine, the proxy); edge: uvicorn/FastAPI.

Invariants
- The ready line is printed (and flushed) only after the server accepts connections; launchers
  (``engines.launch``, ``proxy.launch``) wait for it before they hand out the URL.
- A service ignores SIGUSR1, the preemption signal of a live run: under SLURM a signal to the step reaches every
  process in it, and the ranks (``runtime.preempt``), not their services, decide what preemption does.
- A request whose caller hangs up is given up within ``DISCONNECT_POLL_S`` (its work is aborted or cancelled
  by the caller's ``on_hang_up``) and answered 499, as in SGLang.
- An empty body reads as ``{}``; malformed JSON is the service's own typed error naming line and column.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import signal
import threading
from typing import Any, Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

DISCONNECT_POLL_S = 0.25


async def serve_announced(server: Any, ready_line: str) -> None:
    """Run the ``uvicorn.Server`` ``server`` until it exits; print ``ready_line`` once it has started."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the ranks' preemption signal (module docstring)

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
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise error(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


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
