"""Running an HTTP service process (the local engine, the proxy): serve, and say so once listening.

Invariant: the ready line is printed (and flushed) only after the server accepts connections; launchers
(``engines.launch``, ``proxy.launch``) wait for it before they hand out the URL.
"""
from __future__ import annotations

import asyncio
from typing import Any


async def serve_announced(server: Any, ready_line: str) -> None:
    """Run the ``uvicorn.Server`` ``server`` until it exits; print ``ready_line`` once it has started."""

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        print(ready_line, flush=True)

    task = asyncio.ensure_future(announce())
    try:
        await server.serve()
    finally:
        task.cancel()
