"""The proxy's HTTP face (FastAPI + uvicorn): SGLang's ``/generate`` for the harness, admin endpoints for the runtime.

Run it as its own process (or ``start_proxy`` from ``gyre_hpc.proxy.launch``)::

    python -m gyre_hpc.proxy.server --config CONFIG [--set proxy.port=31000] [--engine 0=http://127.0.0.1:30000 ...]

It prints ``gyre-proxy ready url=http://HOST:PORT pid=PID`` once it accepts connections.

Harness side (SGLang shapes): ``POST /generate`` (``rid = "<run_id>/<call_id>"``, optional top-level
``query_id``), ``POST /abort_request {rid} | {abort_all: true}``, ``GET /health``, ``GET /v1/loads``.
Runtime side: ``GET|POST /admin/engines`` (list / add ``{url, cell, name?}``), ``POST /admin/drain``,
``POST /admin/dead``, ``POST /admin/remove`` (each ``{engine: name} | {cell: index}``), ``GET /admin/stats``,
``GET /admin/events``, ``POST /admin/flush_tito {name, run_ids?, outcomes?}`` (a file name in ``proxy.tito_dir``,
never a path), ``POST /tito/outcome``. docs/proxy.md has
the bodies and answers.

Invariants
- Every refusal has SGLang's error shape ``{"error": {"message": ...}}`` and the ``ProxyError``'s status; the
  message names the offending key.
- A harness that hangs up has its call cancelled within ``DISCONNECT_POLL_S``: the engine request is dropped
  (the engine aborts it) and nothing is recorded.
- Served by ``serving.make_server``: every route needs the job secret; an agent's run key reaches only
  ``/generate``, ``/abort_request`` and ``/tito/outcome`` for its own run (another run, or ``abort_all``: 403).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gyre_hpc.config import ProxyConfig, load_config
from gyre_hpc.errors import GyreError
from gyre_hpc.proxy.calls import split_rid
from gyre_hpc.proxy.openai_api import OpenAIRoutes
from gyre_hpc.proxy.routing import ProxyError
from gyre_hpc.proxy.service import ProxyService
from gyre_hpc.net.serving import answer_unless_hung_up, make_server, read_json, require_run, serve_announced
from gyre_hpc.trajectory.records import Outcome, RunStatus

PROXY_VERSION = "gyre-proxy-1"


async def _json(request: Request) -> Any:
    return await read_json(request, lambda message: ProxyError(f"body: {message}"))


def _fields(body: Any, required: Sequence[str], optional: Sequence[str] = ()) -> dict:
    if not isinstance(body, Mapping):
        raise ProxyError(f"body: expected a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(required) - set(optional))
    if unknown:
        raise ProxyError(f"{unknown[0]}: unknown key; valid keys: {', '.join([*required, *optional])}")
    missing = [k for k in required if k not in body]
    if missing:
        raise ProxyError(f"{missing[0]}: missing")
    return dict(body)


def _own_run(request: Request, body: Any, key: str) -> None:
    """With a run key, the request's ``key`` (a rid or a run id) must name the key's own run (else 403)."""
    grant = request.scope.get("gyre.grant")
    if grant is None or grant.job:
        return
    value = body.get(key) if isinstance(body, Mapping) else None
    if key == "abort_all" or not isinstance(value, str):
        raise ProxyError(f"{key}: a run key may act only on its own run ({grant.run_id!r})", 403)
    require_run(request, split_rid(value)[0] if key == "rid" else value, lambda m: ProxyError(f"{key}: {m}", 403))


def _target(body: Any, *extra: str) -> dict:
    """``{engine: name}`` or ``{cell: index}`` plus the endpoint's own optional keys."""
    body = _fields(body, (), ("engine", "cell", *extra))
    if "cell" in body and (isinstance(body["cell"], bool) or not isinstance(body["cell"], int)):
        raise ProxyError(f"cell: expected a cell index, got {body['cell']!r}")
    if "engine" in body and not isinstance(body["engine"], str):
        raise ProxyError(f"engine: expected an engine name, got {body['engine']!r}")
    return body


def _outcome(body: Any, now: float) -> Outcome:
    """The outcome in ``body``; ``now`` (epoch seconds) stands in for a missing ``t_end``."""
    body = _fields(body, ("run_id", "status", "score"), ("query_id", "t_end", "detail"))
    if not isinstance(body["run_id"], str) or not body["run_id"]:
        raise ProxyError(f"run_id: expected a non-empty string, got {body['run_id']!r}")
    try:
        status = RunStatus(body["status"])
    except ValueError:
        raise ProxyError(f"status: {body['status']!r} is not one of {', '.join(s.value for s in RunStatus)}") from None
    score = body["score"]
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
        raise ProxyError(f"score: expected a number or null, got {score!r}")
    return Outcome(body["run_id"], str(body.get("query_id") or body["run_id"].split("-")[0]), status,
                   None if score is None else float(score), float(body.get("t_end", now)),
                   str(body.get("detail", "")))


class ProxyServer:
    def __init__(self, service: ProxyService):
        self.service = service
        self.app = FastAPI(lifespan=self._lifespan)
        self._routes()
        OpenAIRoutes(service, service.cfg.openai).mount(self.app)  # /runs/{run_id}/v1/... (openai_api.py)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI):
        try:
            yield
        finally:
            await self.service.aclose()

    def _routes(self) -> None:
        add = self.app.add_api_route
        add("/generate", self.generate, methods=["POST", "PUT"])
        add("/abort_request", self.abort_request, methods=["POST"])
        add("/health", self.health, methods=["GET"])
        add("/v1/loads", self.loads, methods=["GET"])
        add("/admin/engines", self.engines, methods=["GET"])
        add("/admin/engines", self.add_engine, methods=["POST"])
        add("/admin/drain", self.drain, methods=["POST"])
        add("/admin/dead", self.dead, methods=["POST"])
        add("/admin/remove", self.remove, methods=["POST"])
        add("/admin/stats", self.stats, methods=["GET"])
        add("/admin/events", self.events, methods=["GET"])
        add("/admin/flush_tito", self.flush_tito, methods=["POST"])
        add("/tito/outcome", self.outcome, methods=["POST"])
        self.app.add_exception_handler(GyreError, self._on_error)

    @staticmethod
    async def _on_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc)}}, status_code=getattr(exc, "status", None) or 400)

    async def generate(self, request: Request):
        body = await _json(request)
        _own_run(request, body, "rid")
        task = asyncio.ensure_future(self.service.generate(body))

        async def cancel() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, GyreError):
                await task

        return await answer_unless_hung_up(request, task, cancel)

    async def abort_request(self, request: Request):
        body = _fields(await _json(request), (), ("rid", "abort_all"))
        if body.get("abort_all"):
            _own_run(request, {}, "abort_all")
        _own_run(request, body, "rid")
        return {"aborted": await self.service.abort(body.get("rid"), bool(body.get("abort_all", False)))}

    async def health(self):
        return {"status": "ok", "engines_active": len(self.service.router.active())}

    async def loads(self):
        engines = self.service.router.engines()
        loads = [{"dp_rank": i, "num_running_reqs": e.load, "num_waiting_reqs": 0, "num_total_reqs": e.load,
                  "engine": e.name, "url": e.url, "cell": e.cell, "state": e.state.value}
                 for i, e in enumerate(engines)]
        total = sum(e.load for e in engines)
        return {"timestamp": datetime.now(timezone.utc).isoformat(), "version": PROXY_VERSION,
                "dp_rank_count": len(engines), "loads": loads,
                "aggregate": {"total_running_reqs": total, "total_waiting_reqs": 0, "total_reqs": total}}

    async def engines(self):
        return {"engines": [e.describe() for e in self.service.router.engines()]}

    async def add_engine(self, request: Request):
        body = _fields(await _json(request), ("url", "cell"), ("name",))
        for key in ("url", "name"):
            if key in body and (not isinstance(body[key], str) or not body[key]):
                raise ProxyError(f"{key}: expected a non-empty string, got {body[key]!r}")
        return self.service.add_engine(body["url"], body["cell"], body.get("name")).describe()

    async def drain(self, request: Request):
        body = _target(await _json(request), "timeout_s")
        return await self.service.drain(body.get("engine"), body.get("cell"), body.get("timeout_s"))

    async def dead(self, request: Request):
        body = _target(await _json(request), "reason")
        return self.service.mark_dead(body.get("engine"), body.get("cell"), str(body.get("reason", "reported dead")))

    async def remove(self, request: Request):
        body = _target(await _json(request))
        return await self.service.remove(body.get("engine"), body.get("cell"))

    async def stats(self):
        return self.service.stats()

    async def events(self, request: Request):
        raw = request.query_params.get("since", "0")
        if not raw.isdigit():
            raise ProxyError(f"since: expected an event index >= 0, got {raw!r}")
        since = int(raw)
        return {"events": list(self.service.events.events)[since:]}

    async def flush_tito(self, request: Request):
        body = _fields(await _json(request), ("name",), ("run_ids", "outcomes"))
        run_ids = body.get("run_ids")
        if run_ids is not None and (not isinstance(run_ids, list) or not all(isinstance(r, str) for r in run_ids)):
            raise ProxyError(f"run_ids: expected a list of run ids or null, got {run_ids!r}")
        outcomes = body.get("outcomes")
        if outcomes is not None and not isinstance(outcomes, list):
            raise ProxyError(f"outcomes: expected a list of outcome objects or null, got {outcomes!r:.80}")
        return self.service.flush_tito(body["name"], run_ids,
                                       None if outcomes is None
                                       else [_outcome(o, self.service.clock.wall()) for o in outcomes])

    async def outcome(self, request: Request):
        body = await _json(request)
        _own_run(request, body, "run_id")
        outcome = _outcome(body, self.service.clock.wall())
        self.service.record_outcome(outcome)
        return {"run_id": outcome.run_id, "status": outcome.status.value}


def _engine_arg(text: str) -> tuple[int, str]:
    cell, sep, url = text.partition("=")
    if not sep or not cell.isdigit() or not url:
        raise argparse.ArgumentTypeError(f"expected CELL=URL (e.g. 0=http://127.0.0.1:30000), got {text!r}")
    return int(cell), url


async def serve(cfg: ProxyConfig, engines: Sequence[tuple[int, str]] = (), host: str | None = None,
                port: int | None = None) -> None:
    host, port = host or cfg.host, port or cfg.port
    service = ProxyService(cfg)
    for cell, url in engines:
        service.add_engine(url, cell)
    server = make_server(ProxyServer(service).app, host, port, cfg.http, run_keys=True)

    await serve_announced(server, f"gyre-proxy ready url=http://{host}:{port} pid={os.getpid()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre_hpc.proxy.server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=None, help="listen address (default: proxy.host)")
    parser.add_argument("--port", type=int, default=None, help="listen port (default: proxy.port)")
    parser.add_argument("--config", default=None, help="YAML config (default: the embedded defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--engine", dest="engines", action="append", default=[], type=_engine_arg,
                        metavar="CELL=URL", help="an engine to route to from the start (repeatable)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides).proxy
    except GyreError as exc:
        print(f"gyre-proxy: error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(cfg, args.engines, args.host, args.port))
    except GyreError as exc:
        print(f"gyre-proxy: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
