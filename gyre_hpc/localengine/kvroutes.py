"""The local engine's KV-move endpoints (behind the same job-secret guard as every route; SGLang has none):

    POST /kv/export  {tokens}                       200 {move_id, location, address, nbytes, tokens, version, ...}
    POST /kv/import  {descriptor, keep_version}     200 {moved_tokens, hit_tokens, blocks_written, bytes}
    POST /kv/release {move_id}                      200 {released}

Every refusal is ``{"error": {"message", "reason"}}`` with a reason the proxy logs as the fallback's cause:
``no_kv_cache`` (400), ``nothing_cached`` (404), ``version_mismatch`` / ``checksum_mismatch`` / ``geometry``
(409), ``target_full`` (503), ``transfer_error`` (502).

Invariants
- Bookkeeping changes (export's block lookup, import's registration) run on the event loop between ticks, never in
  a worker thread; only the Mooncake transfer and the staging copy run in threads.
- A refused import leaves the target's KV pool unchanged (``kvprefix``).
"""
from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gyre_hpc.localengine.kvcache import KVPoolFull
from gyre_hpc.localengine.kvport import KVPort
from gyre_hpc.localengine.kvprefix import bundle_from, export_prefix, import_prefix
from gyre_hpc.errors import TransferError

_REASONS = (("checksum mismatch", "checksum_mismatch"), ("version mismatch", "version_mismatch"),
            ("geometry", "geometry"))


def _refuse(reason: str, message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "reason": reason}}, status_code=status)


def add_kv_routes(app: FastAPI, scheduler, port: KVPort) -> None:
    s = scheduler

    async def body(request: Request) -> dict:
        data = await request.json()
        return data if isinstance(data, dict) else {}

    async def export(request: Request):
        if s.kv is None:
            return _refuse("no_kv_cache", "engine.kv_cache is off: no KV blocks to export", 400)
        tokens = [int(t) for t in (await body(request)).get("tokens", [])]
        bundle = export_prefix(s.kv, tokens, s.version)
        if bundle is None:
            return _refuse("nothing_cached", f"no cached KV block prefixes these {len(tokens)} tokens", 404)
        try:
            return await asyncio.to_thread(port.stage, bundle)
        except TransferError as exc:
            return _refuse("transfer_error", str(exc), 502)

    async def import_(request: Request):
        if s.kv is None:
            return _refuse("no_kv_cache", "engine.kv_cache is off: cannot take KV blocks", 400)
        data = await body(request)
        desc = data.get("descriptor") or {}
        try:
            raw = await asyncio.to_thread(port.pull, desc)
            done = import_prefix(s.kv, bundle_from(desc, raw), s.version, bool(data.get("keep_version", False)))
        except KVPoolFull as exc:
            return _refuse("target_full", str(exc), 503)
        except TransferError as exc:
            reason = next((code for text, code in _REASONS if text in str(exc)), "transfer_error")
            return _refuse(reason, str(exc), 409 if reason != "transfer_error" else 502)
        return {**done, "bytes": int(raw.nbytes)}

    async def release(request: Request):
        return {"released": port.release(str((await body(request)).get("move_id", "")))}

    app.add_api_route("/kv/export", export, methods=["POST"])
    app.add_api_route("/kv/import", import_, methods=["POST"])
    app.add_api_route("/kv/release", release, methods=["POST"])
