"""The local engine's weight updates: ``/init_weights_update_group``, ``/update_weights_from_distributed``,
``/destroy_weights_update_group`` (SGLang 0.5.23's names, bodies and answers; the sender is
``gyre_hpc.engines.weight_sync.WeightPusher``), and ``/update_weights_from_tensor`` (tensors shared on this host,
SGLang's serialization; the sender is ``gyre_hpc.engines.weight_tensor.TensorPusher``).

The engine joins a torch group (gloo on CPU) as ``rank_offset``; an update receives one broadcast per announced
tensor from group rank 0, in the announced order, into fresh tensors (generation goes on meanwhile with the old
weights), maps Hugging Face names back to megatron's (``train.hf_weights.to_megatron``; megatron names are taken as
they are), then loads them between two decode ticks. Tokens decoded after the load carry ``weight_version``.

Invariants
- ``/update_weights_from_distributed`` and ``/update_weights_from_tensor`` outside ``/begin_weight_update`` …
  ``/end_weight_update`` are a 400 and receive nothing (as SGLang); so is a distributed one naming a group that
  was not initialised. A tensor payload is unpickled with only torch's tensor/storage rebuilders allowed.
- A refused update (names that do not cover the model, wrong shapes or dtypes) leaves the loaded weights and the
  version untouched and answers 400 with ``success: false``.
- Buckets (``gyre_hpc.train.reshard``): a distributed update without ``weight_version`` whose tensors do not cover the
  model is staged, not loaded; the staged tensors load together with the update that completes the model (the last
  bucket carries the version), all at once between two ticks. An update carrying a version that still does not
  cover the model is refused as above, and the staged tensors are dropped (so are they at ``/begin_weight_update``
  and ``/end_weight_update``): no model is ever half old, half new (SGLang loads each bucket as it comes; the
  engine is paused in place meanwhile).
- ``abort_all_requests`` defaults to false: in-flight requests survive an update. ``flush_cache: true`` while
  requests run answers 400 after the weights were loaded (SGLang's behaviour: the prefix cache cannot be flushed).
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gyre_hpc.engines import protocol as P
from gyre_hpc.errors import CheckpointError, EngineError
from gyre_hpc.net.serving import read_json

DTYPES = ("float32", "float16", "bfloat16", "float64")


def _str(body: Mapping, key: str, default: Any = None) -> str:
    v = body.get(key, default)
    if not isinstance(v, str) or not v:
        raise P.EngineRequestError(key, f"expected a non-empty string, got {v!r}")
    return v


def parse_init_group(body: Any) -> dict:
    body = P._object(body)
    P._only(body, ("master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"))
    out = {"address": _str(body, "master_address"), "port": P._int("master_port", body.get("master_port"), 1),
           "rank_offset": P._int("rank_offset", body.get("rank_offset"), 1),
           "world_size": P._int("world_size", body.get("world_size"), 2),
           "group_name": _str(body, "group_name", "weight_update_group"), "backend": _str(body, "backend", "nccl")}
    if out["rank_offset"] >= out["world_size"]:
        raise P.EngineRequestError("rank_offset", f"{out['rank_offset']} is not below world_size={out['world_size']}")
    if out["backend"] != "gloo":
        raise P.EngineRequestError("backend", f"{out['backend']!r}: the local engine runs on the CPU (gloo only)")
    return out


def parse_update_distributed(body: Any) -> dict:
    body = P._object(body)
    P._only(body, ("names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests", "weight_version",
                   "load_format", "selector", "torch_empty_cache"))
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise P.EngineRequestError("names", f"expected a non-empty list of tensor names, got {str(names)[:100]}")
    if not isinstance(dtypes, list) or len(dtypes) != len(names) or any(d not in DTYPES for d in dtypes):
        raise P.EngineRequestError("dtypes", f"expected {len(names)} of {', '.join(DTYPES)}, got {str(dtypes)[:100]}")
    if (not isinstance(shapes, list) or len(shapes) != len(names)
            or not all(isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes)):
        raise P.EngineRequestError("shapes", f"expected {len(names)} lists of sizes, got {str(shapes)[:100]}")
    if body.get("load_format") is not None:
        raise P.EngineRequestError("load_format", f"{body['load_format']!r} is not supported (only null)")
    version = body.get("weight_version")
    if version is not None and (not isinstance(version, str) or not version):
        raise P.EngineRequestError("weight_version", f"expected a non-empty string, got {version!r}")
    return {"names": names, "dtypes": dtypes, "shapes": shapes, "version": version,
            "group_name": _str(body, "group_name", "weight_update_group"),
            "flush_cache": P._bool("flush_cache", body.get("flush_cache", True)),
            "abort_all": P._bool("abort_all_requests", body.get("abort_all_requests", False))}


def parse_update_tensor(body: Any) -> dict:
    """SGLang's ``UpdateWeightsFromTensorReqInput`` (payloads: base64 strings, one per TP rank; rank 0's is used)."""
    import base64
    import binascii

    body = P._object(body)
    P._only(body, ("serialized_named_tensors", "load_format", "flush_cache", "abort_all_requests", "weight_version",
                   "selector", "torch_empty_cache"))
    payloads = body.get("serialized_named_tensors")
    if not isinstance(payloads, list) or not payloads or not all(isinstance(p, str) and p for p in payloads):
        raise P.EngineRequestError("serialized_named_tensors", f"expected a non-empty list of base64 strings, got "
                                                          f"{str(payloads)[:100]}")
    try:
        data = base64.b64decode(payloads[0], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise P.EngineRequestError("serialized_named_tensors", f"not base64: {exc}") from None
    if body.get("load_format") is not None:
        raise P.EngineRequestError("load_format", f"{body['load_format']!r} is not supported (only null)")
    version = body.get("weight_version")
    if version is not None and (not isinstance(version, str) or not version):
        raise P.EngineRequestError("weight_version", f"expected a non-empty string, got {version!r}")
    return {"data": data, "version": version, "flush_cache": P._bool("flush_cache", body.get("flush_cache", True)),
            "abort_all": P._bool("abort_all_requests", body.get("abort_all_requests", False))}


async def _body(request: Request) -> Any:
    return await read_json(request, lambda message: P.EngineRequestError("body", message))


def _fail(message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, 400)


def to_model_names(received: dict, model_cfg, own: set[str]) -> dict:
    """Received tensors → the model's megatron names (HF names are mapped back; megatron names pass)."""
    if set(received) <= own:
        return received
    if model_cfg is None:
        raise EngineError("Hugging Face names need the model config (the engine was built without one)", status=400)
    from gyre_hpc.train.hf_weights import to_megatron

    try:
        return to_megatron(received, model_cfg)
    except CheckpointError as exc:
        raise EngineError(str(exc), status=400) from None


def covers(names: set[str], model_cfg, own: set[str]) -> bool:
    """True when ``names`` hold every tensor of the model, under megatron's names or the HF ones."""
    if own <= names:
        return True
    if model_cfg is None:
        return False
    from gyre_hpc.train.hf_weights import entries

    return {h for _, hnames, _ in entries(model_cfg) for h in hnames} <= names


def add_weight_routes(app: FastAPI, engine) -> None:
    """Add the three routes to ``engine.app``; ``engine`` is a ``LocalEngine`` (scheduler ``s``, ``model_cfg``,
    ``in_weight_update``)."""
    from gyre_hpc.engines import weight_sync as W

    groups: dict[str, object] = {}

    async def init_weights_update_group(request: Request):
        g = parse_init_group(await _body(request))
        if g["group_name"] in groups:
            return _fail(f"group {g['group_name']!r} exists; destroy it first")
        try:
            groups[g["group_name"]] = await asyncio.to_thread(
                W.open_group, g["address"], g["port"], g["world_size"], g["rank_offset"], g["group_name"], "gloo")
        except Exception as exc:  # rendezvous timeout, refused connection
            return _fail(f"Failed to initialize custom process group: {exc}.")
        return {"success": True, "message": "Succeeded to initialize custom process group."}

    async def destroy_weights_update_group(request: Request):
        name = _str(P._object(await _body(request)), "group_name", "weight_update_group")
        pg = groups.pop(name, None)
        if pg is None:
            return _fail("The group to be destroyed does not exist.")
        await asyncio.to_thread(W.close_group, pg)
        return {"success": True, "message": "Succeeded to destroy custom process group."}

    async def update_weights_from_distributed(request: Request):
        u = parse_update_distributed(await _body(request))
        if not engine.in_weight_update:
            return _fail("update_weights_from_distributed must run between begin_weight_update() and "
                         "end_weight_update()")
        if u["group_name"] not in groups:
            return _fail(f"Group {u['group_name']} not in {list(groups)}. Please call `init_weights_update_group` "
                         "first.")
        if u["abort_all"]:
            engine.s.abort(abort_all=True, message="aborted by update_weights_from_distributed")
        try:
            received = await asyncio.to_thread(W.receive, groups[u["group_name"]], u["names"], u["dtypes"],
                                               u["shapes"])
        except Exception as exc:  # the sender died or timed out
            return _fail(f"Failed to receive weights: {exc}")
        own = set(engine.s.policy.state())
        merged, engine.staged = {**engine.staged, **received}, {}
        if u["version"] is None and not covers(set(merged), engine.model_cfg, own):
            engine.staged = merged  # one bucket of a streamed update: loaded once the buckets cover the model
            return {"success": True, "message": f"Staged {len(received)} tensors ({len(merged)} so far)."}
        try:
            state = to_model_names(merged, engine.model_cfg, own)
            await engine.s.load_weights(state, u["version"])
        except EngineError as exc:
            return _fail(str(exc))
        return _loaded(u)

    def _loaded(u: dict):
        engine.pushed = True
        if u["flush_cache"] and engine.s.busy():
            return _fail("Weights were updated, but the cache was not flushed because requests are still running "
                         "or queued. Retract or finish them, then call /flush_cache.")
        return {"success": True, "message": "Succeeded to update parameter online."}

    async def update_weights_from_tensor(request: Request):
        from gyre_hpc.engines import weight_tensor as T

        if not engine.in_weight_update:
            await _body(request)
            return _fail("update_weights_from_tensor must run between begin_weight_update() and end_weight_update()")
        u = parse_update_tensor(await _body(request))
        if u["abort_all"]:
            engine.s.abort(abort_all=True, message="aborted by update_weights_from_tensor")
        try:
            named = await asyncio.to_thread(T.deserialize, u["data"])
            state = to_model_names(dict(named), engine.model_cfg, set(engine.s.policy.state()))
            await engine.s.load_weights(state, u["version"])
        except EngineError as exc:
            return _fail(str(exc))
        return _loaded(u)

    for route in (init_weights_update_group, destroy_weights_update_group, update_weights_from_distributed,
                  update_weights_from_tensor):  # each route is named after its handler, as in SGLang
        app.add_api_route(f"/{route.__name__}", route, methods=["POST"])
