"""The local rollout engine: SGLang's HTTP protocol (FastAPI + uvicorn, as SGLang) over a ``Scheduler``.

Run it as its own process::

    python -m gyre_hpc.localengine.server --port 30000 --host 127.0.0.1 --config CONFIG [--set engine.x=y ...]

It reads the ``engine``, ``model`` and ``run.seed`` sections, builds the policy (the trainer's megatron
``GPTModel``, initialised from ``run.seed`` or loaded from ``engine.model_path``) and prints one line
``gyre-engine ready url=http://HOST:PORT pid=PID weight_version=V`` once it accepts connections.

Endpoints (SGLang 0.5.23 names and shapes; see docs/engines.md for what the local engine leaves out):
``/generate``, ``/abort_request``, ``/pause_generation``, ``/continue_generation``, ``/begin_weight_update``,
``/end_weight_update``, ``/update_weights_from_disk``, ``/update_weight_version``, ``/weights_checker``,
``/flush_cache``, ``/health``, ``/health_generate``, ``/model_info``, ``/server_info``, ``/v1/loads``, and the
KV mover's ``/kv/export``, ``/kv/import``, ``/kv/release`` (``kvroutes``; local engine only);
``/init_weights_update_group``, ``/update_weights_from_distributed``, ``/destroy_weights_update_group`` (gloo;
``weight_routes``: the hot path of new weights, ``engines.weight_sync``); ``/update_weights_from_tensor`` (tensors
shared on this host, ``engines.weight_tensor``; 400 outside begin/end, as SGLang).

Invariants
- Every refused request gets SGLang's error shape ``{"error": {"message": ...}}`` with 400 (bad input), 503
  (overloaded) or the ``EngineError`` status; a validation error never reaches the scheduler.
- A ``/generate`` whose caller disconnects is aborted within ``DISCONNECT_POLL_S`` (its slot is freed).
- ``weight_version`` changes only through ``/update_weights_from_disk``, ``/update_weights_from_distributed`` (when
  given) and ``/update_weight_version``, and ``/model_info``, ``/weights_checker`` and new tokens see the change together.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import uuid
from datetime import datetime, timezone

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gyre_hpc.config import EngineConfig, ModelConfig, TransferConfig, load_config
from gyre_hpc.engines import protocol as P
from gyre_hpc.localengine.kvport import KVPort
from gyre_hpc.localengine.kvroutes import add_kv_routes
from gyre_hpc.localengine.scheduler import Scheduler
from gyre_hpc.localengine.weight_routes import add_weight_routes
from gyre_hpc.engines.weights import load_weights_dir
from gyre_hpc.errors import ConfigError, EngineError, GyreError
from gyre_hpc.net.serving import answer_unless_hung_up, make_server, read_json, serve_announced

ENGINE_VERSION = "gyre-local-1"
HEALTH_TIMEOUT_S = 20.0


def _error(exc: Exception, status: int = 400) -> JSONResponse:
    return JSONResponse(P.error_body(str(exc)), status_code=getattr(exc, "status", None) or status)


async def _json(request: Request) -> object:
    return await read_json(request, lambda message: P.EngineRequestError("body", message))


class LocalEngine:
    """The HTTP face of one scheduler (state that is not per request: weight-update session, model path)."""

    def __init__(self, scheduler: Scheduler, cfg: EngineConfig, model_path: str | None = None,
                 transfer: TransferConfig | None = None, model_cfg: ModelConfig | None = None):
        self.s = scheduler
        self.model_cfg = model_cfg  # maps Hugging Face names of distributed updates back (weight_routes)
        self.kv_port = KVPort(transfer or TransferConfig())  # /kv/* (gyre_hpc.localengine.kvroutes)
        self.cfg = cfg
        self.model_path = model_path
        self.in_weight_update = False
        self.staged: dict = {}  # HF tensors of a streamed (bucketed) update, until they cover the model
        self.disk_version = scheduler.version  # the version of the weights model_path (or the seed) holds
        self.pushed = False  # weights came over /update_weights_from_distributed since the last disk load
        self.app = FastAPI(lifespan=self._lifespan)
        self._routes()

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI):
        task = asyncio.create_task(self.s.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _routes(self) -> None:
        app, add = self.app, self.app.add_api_route
        add("/generate", self.generate, methods=["POST", "PUT"])
        add("/abort_request", self.abort_request, methods=["POST"])
        add("/pause_generation", self.pause_generation, methods=["POST"])
        add("/continue_generation", self.continue_generation, methods=["POST"])
        add("/begin_weight_update", self.begin_weight_update, methods=["POST"])
        add("/end_weight_update", self.end_weight_update, methods=["POST"])
        add("/update_weights_from_disk", self.update_weights_from_disk, methods=["POST"])
        add_weight_routes(app, self)
        add("/update_weight_version", self.update_weight_version, methods=["POST"])
        add("/release_memory_occupation", self.release_memory_occupation, methods=["GET", "POST"])
        add("/resume_memory_occupation", self.resume_memory_occupation, methods=["GET", "POST"])
        add("/weights_checker", self.weights_checker, methods=["GET", "POST"])
        add("/flush_cache", self.flush_cache, methods=["GET", "POST"])
        add("/health", self.health, methods=["GET"])
        add("/ready", self.health, methods=["GET"])
        add("/health_generate", self.health_generate, methods=["GET"])
        for path in ("/model_info", "/get_model_info"):
            add(path, self.model_info, methods=["GET"])
        for path in ("/server_info", "/get_server_info"):
            add(path, self.server_info, methods=["GET"])
        add("/get_weight_version", self.get_weight_version, methods=["GET"])
        add("/v1/loads", self.loads, methods=["GET"])
        add_kv_routes(app, self.s, self.kv_port)
        app.add_exception_handler(GyreError, self._on_error)

    @staticmethod
    async def _on_error(request: Request, exc: Exception) -> JSONResponse:
        return _error(exc)

    # ------------------------------------------------------------------------------------------ generate
    async def generate(self, request: Request):
        req = P.parse_generate(await _json(request), self.s.policy.vocab_size, self.cfg.default_max_new_tokens)
        future = self.s.submit(req)
        # a caller that hangs up (timeout, cancelled run) frees its slot, as in SGLang
        return await answer_unless_hung_up(request, future,
                                           lambda: self.s.abort(req.rid, message="client disconnected"))

    async def abort_request(self, request: Request):
        rid, abort_all = P.parse_abort(await _json(request))
        self.s.abort(rid, abort_all)
        return Response(status_code=200)

    async def pause_generation(self, request: Request):
        await self.s.pause(P.parse_pause(await _json(request)))
        return {"message": "Generation paused successfully.", "status": "ok"}

    async def continue_generation(self, request: Request):
        await _json(request)
        self.s.resume()
        return {"message": "Generation continued successfully.", "status": "ok"}

    # ------------------------------------------------------------------------------------------- weights
    async def begin_weight_update(self, request: Request):
        await _json(request)
        if self.in_weight_update:
            return JSONResponse({"success": False, "message": "a weight update is already in progress"}, 400)
        self.in_weight_update, self.staged = True, {}
        return {"success": True, "message": "weight update begun"}

    async def end_weight_update(self, request: Request):
        await _json(request)
        if not self.in_weight_update:
            return JSONResponse({"success": False, "message": "no weight update in progress"}, 400)
        self.in_weight_update, self.staged = False, {}
        return {"success": True, "message": "weight update ended"}

    async def update_weights_from_disk(self, request: Request):
        upd = P.parse_update_from_disk(await _json(request))
        if upd.abort_all_requests:
            self.s.abort(abort_all=True, message="aborted by update_weights_from_disk")
        try:
            state, meta = await asyncio.to_thread(load_weights_dir, upd.model_path)
            await self.s.load_weights(state, upd.weight_version)
        except EngineError as exc:
            return JSONResponse({"success": False, "message": str(exc), "num_paused_requests": 0}, 400)
        self.model_path = upd.model_path
        self.disk_version, self.pushed = self.s.version, False
        message = f"Succeeded to update model weights from {upd.model_path}."
        if upd.weight_version is not None:
            message += f" Weight version updated to {upd.weight_version}."
        return {"success": True, "message": message, "num_paused_requests": 0}

    async def update_weight_version(self, request: Request):
        version, abort_all = P.parse_update_weight_version(await _json(request))
        if abort_all:
            self.s.abort(abort_all=True, message="aborted by update_weight_version")
        self.s.version = version
        return {"success": True, "message": f"Weight version updated to {version}", "new_version": version}

    async def release_memory_occupation(self, request: Request):
        """Sleep: free the named memory (``weights`` frees every weight tensor; this engine has no KV cache or
        CUDA graphs to free). Refused while requests run or wait: pause and drain first, as with SGLang."""
        tags = P.parse_memory_tags(await _json(request))
        try:
            await self.s.release_memory(tags)
        except EngineError as exc:
            return JSONResponse({"success": False, "message": str(exc)}, 400)
        return {"success": True, "message": f"released {', '.join(tags)}"}

    async def resume_memory_occupation(self, request: Request):
        """Wake: give the memory back; released weights are reloaded from disk (the last weights directory loaded,
        else the seed's initial weights). The weight version is unchanged, unless the released weights had come
        over ``/update_weights_from_distributed``: then it goes back to the version of the disk weights, and the
        sender pushes the newest version again (``cell.rollout``)."""
        tags = P.parse_memory_tags(await _json(request))
        path = self.model_path
        reload_weights = "weights" in tags and "weights" in self.s.released
        await self.s.resume_memory(tags, lambda: load_weights_dir(path)[0] if path else self.s.policy.initial_state())
        if reload_weights and self.pushed:
            self.s.version, self.pushed = self.disk_version, False
        return {"success": True, "message": f"resumed {', '.join(tags)}"}

    async def weights_checker(self, request: Request):
        body = await _json(request) if request.method == "POST" else dict(request.query_params)
        action = body.get("action", "checksum") if isinstance(body, dict) else None
        if action != "checksum":
            return JSONResponse({"success": False, "message": f"action {action!r} is not supported (checksum)"}, 400)
        checksum = await self.s.exclusive(self.s.policy.checksum)
        return {"success": True, "message": "checksum of the loaded weights",
                "payload": {"checksum": checksum, "weight_version": self.s.version}}

    # ------------------------------------------------------------------------------------------- status
    async def flush_cache(self):
        ok = not self.s.busy()
        if ok:
            self.s.flush_kv()
        text = "Cache flushed.\n" if ok else "Cache not flushed: there are running or waiting requests.\n"
        return Response(content=text, status_code=200 if ok else 400)

    async def health(self):
        return Response(status_code=200)

    async def health_generate(self):
        req = P.GenerateRequest(f"HEALTH_CHECK_{uuid.uuid4().hex}", (0,),
                                P.SamplingParams(max_new_tokens=1, temperature=0))
        try:
            await asyncio.wait_for(self.s.generate(req), HEALTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.s.abort(req.rid)
            return Response(status_code=503)
        return Response(status_code=200)

    async def model_info(self):
        return {"model_path": self.model_path, "tokenizer_path": None, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": self.s.version}

    async def get_weight_version(self):
        return {"weight_version": self.s.version}

    async def server_info(self):
        running, waiting, _ = self.s.loads()
        return {"engine": "local", "version": ENGINE_VERSION, "weight_version": self.s.version,
                "max_running_requests": self.cfg.max_running_requests, "context_len": self.cfg.context_len,
                "vocab_size": self.s.policy.vocab_size, "paused": self.s.paused, "memory_released": sorted(self.s.released),
                "num_running_reqs": running,
                "num_waiting_reqs": waiting, "generated_tokens": self.s.generated_tokens,
                "forward_calls": self.s.forward_calls, **(self.s.kv.stats() if self.s.kv is not None else {})}

    async def loads(self):
        running, waiting, used = self.s.loads()
        return P.loads_response(running, waiting, self.cfg.max_running_requests, used,
                                self.cfg.max_running_requests * self.cfg.context_len,
                                datetime.now(timezone.utc).isoformat(), ENGINE_VERSION)


# ---------------------------------------------------------------------------------------------------- main
def build_engine(config_path: str | None, overrides: list[str]) -> LocalEngine:
    """Load the config, build the megatron policy (and load ``engine.model_path``), wrap it in a ``LocalEngine``."""
    cfg = load_config(config_path, overrides)
    if cfg.engine.context_len > cfg.model.max_seq_len:
        raise ConfigError(f"engine.context_len: {cfg.engine.context_len} exceeds model.max_seq_len="
                          f"{cfg.model.max_seq_len}")
    from gyre_hpc.localengine.policy import MegatronPolicy  # torch + megatron: seconds, so only after the checks

    policy = MegatronPolicy(cfg.model, seed=cfg.run.seed, threads=cfg.engine.torch_threads)
    engine_cfg = cfg.engine
    if engine_cfg.model_path is not None:
        state, meta = load_weights_dir(engine_cfg.model_path)
        policy.load_weights(state)
        engine_cfg = dataclasses.replace(engine_cfg, initial_weight_version=meta["weight_version"])
    return LocalEngine(Scheduler(policy, engine_cfg, seed=cfg.run.seed), engine_cfg, engine_cfg.model_path,
                       cfg.transfer, cfg.model)


async def serve(engine: LocalEngine, host: str, port: int) -> None:
    """Serve until SIGTERM/SIGINT; on the signal every request is aborted first, so waiting callers get their
    partial output (200, finish_reason abort) instead of a dropped connection."""
    import uvicorn

    loop = asyncio.get_running_loop()

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            loop.call_soon_threadsafe(engine.s.abort, None, True, "engine shutting down")
            super().handle_exit(sig, frame)

    server = make_server(engine.app, host, port, engine.cfg.http, server_class=Server)

    await serve_announced(server, f"gyre-engine ready url=http://{host}:{port} pid={os.getpid()} "
                                  f"weight_version={engine.s.version}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre_hpc.localengine.server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=None, help="listen address (default: engine.host)")
    parser.add_argument("--port", type=int, default=None, help="listen port (default: engine.port_base)")
    parser.add_argument("--config", default=None, help="YAML config (default: the embedded defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        engine = build_engine(args.config, args.overrides)
    except GyreError as exc:
        print(f"gyre-engine: error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(engine, args.host or engine.cfg.host, args.port or engine.cfg.port_base))
    except GyreError as exc:
        print(f"gyre-engine: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
