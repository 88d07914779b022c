"""A client for any SGLang-protocol engine URL: the local engine or a real SGLang 0.5.23 server.

It uses only endpoints and fields both serve (docs/engines.md lists them), so nothing here knows which engine
answers. ``EngineClient`` is synchronous (httpx.Client); ``AsyncEngineClient`` has the same methods as
coroutines (httpx.AsyncClient) for the proxy's event loop. Both share the request specs below.

Invariants
- Only refused or dropped *connections* are retried (httpx transport retries, ``connect_retries`` times): a call
  the engine answered is never repeated, so a ``/generate`` is never run twice by the client.
- Every request carries ``Authorization: Bearer <token>``: ``token``, else the job secret ``$GYRE_JOB_SECRET``
  (``gyre_hpc.net.auth``); the engines and the proxy refuse requests without it (401).
- Every failure is an ``EngineError`` with ``status`` (None when no answer came) and ``endpoint``; the message
  carries the engine's own error text. A 2xx answer of the wrong shape is an ``EngineError`` too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import httpx

from gyre_hpc.net import auth, tls
from gyre_hpc.config import EngineConfig
from gyre_hpc.engines.protocol import GenerateResult
from gyre_hpc.errors import EngineError


@dataclass(frozen=True)
class EngineLoad:
    running: int
    waiting: int

    @property
    def total(self) -> int:
        return self.running + self.waiting


class _Spec(NamedTuple):
    method: str
    path: str
    body: Any
    parse: Callable[[httpx.Response], Any]


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise EngineError(f"{resp.request.url}: answer is not JSON: {resp.text[:200]!r}",
                          resp.status_code, resp.request.url.path) from None


def _nothing(resp: httpx.Response) -> None:
    return None


def _field(name: str) -> Callable[[httpx.Response], Any]:
    def parse(resp: httpx.Response) -> Any:
        body = _json(resp)
        if not isinstance(body, dict) or name not in body:
            raise EngineError(f"{resp.request.url}: answer has no {name!r}: {str(body)[:200]}",
                              resp.status_code, resp.request.url.path)
        return body[name]
    return parse


def _checksum(resp: httpx.Response) -> str:
    payload = _field("payload")(resp)
    if not isinstance(payload, dict) or "checksum" not in payload:
        raise EngineError(f"{resp.request.url}: weights_checker payload has no checksum: {payload!r}",
                          resp.status_code, "/weights_checker")
    return str(payload["checksum"])


def _loads(resp: httpx.Response) -> EngineLoad:
    body = _json(resp)
    try:
        loads = body["loads"]
        return EngineLoad(sum(int(x["num_running_reqs"]) for x in loads), sum(int(x["num_waiting_reqs"]) for x in loads))
    except (KeyError, TypeError, ValueError):
        raise EngineError(f"{resp.request.url}: malformed /v1/loads answer: {str(body)[:200]}",
                          resp.status_code, "/v1/loads") from None


def _generate(resp: httpx.Response) -> GenerateResult:
    return GenerateResult.from_response(_json(resp))


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):  # SGLang's answer to a body it cannot parse: {"error": "unknown field ..."}
            return err
        if "message" in body:
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:300]


class _Specs:
    """The protocol calls, as data; both clients execute them."""

    @staticmethod
    def generate(input_ids: Sequence[int], sampling_params: dict | None, rid: str | None,
                 return_logprob: bool) -> _Spec:
        body = {"input_ids": [int(t) for t in input_ids], "sampling_params": dict(sampling_params or {}),
                "return_logprob": bool(return_logprob)}
        if rid is not None:
            body["rid"] = rid
        return _Spec("POST", "/generate", body, _generate)

    abort = staticmethod(lambda rid: _Spec("POST", "/abort_request", {"rid": rid}, _nothing))
    abort_all = staticmethod(lambda: _Spec("POST", "/abort_request", {"abort_all": True}, _nothing))
    pause = staticmethod(lambda mode: _Spec("POST", "/pause_generation", {"mode": mode}, _nothing))
    resume = staticmethod(lambda: _Spec("POST", "/continue_generation", {}, _nothing))
    begin_weight_update = staticmethod(lambda: _Spec("POST", "/begin_weight_update", {}, _nothing))
    end_weight_update = staticmethod(lambda: _Spec("POST", "/end_weight_update", {}, _nothing))
    update_weight_version = staticmethod(lambda version, abort_all_requests: _Spec(
        "POST", "/update_weight_version", {"new_version": str(version), "abort_all_requests": abort_all_requests},
        _nothing))
    weight_version = staticmethod(lambda: _Spec("GET", "/model_info", None, lambda r: str(_field("weight_version")(r))))
    model_info = staticmethod(lambda: _Spec("GET", "/model_info", None, _json))
    server_info = staticmethod(lambda: _Spec("GET", "/server_info", None, _json))
    weights_checksum = staticmethod(lambda: _Spec("POST", "/weights_checker", {"action": "checksum"}, _checksum))
    loads = staticmethod(lambda: _Spec("GET", "/v1/loads", None, _loads))
    flush_cache = staticmethod(lambda: _Spec("POST", "/flush_cache", None, _nothing))
    release_memory = staticmethod(lambda tags: _Spec("POST", "/release_memory_occupation",
                                                     {} if tags is None else {"tags": list(tags)}, _nothing))
    resume_memory = staticmethod(lambda tags: _Spec("POST", "/resume_memory_occupation",
                                                    {} if tags is None else {"tags": list(tags)}, _nothing))

    @staticmethod
    def update_weights_from_disk(path: str, version: str | None, abort_all_requests: bool, flush_cache: bool) -> _Spec:
        body = {"model_path": str(path), "abort_all_requests": abort_all_requests, "flush_cache": flush_cache}
        if version is not None:
            body["weight_version"] = str(version)
        return _Spec("POST", "/update_weights_from_disk", body, _json)

    @staticmethod
    def init_weights_update_group(address: str, port: int, rank_offset: int, world_size: int, group_name: str,
                                  backend: str) -> _Spec:
        return _Spec("POST", "/init_weights_update_group",
                     {"master_address": address, "master_port": int(port), "rank_offset": int(rank_offset),
                      "world_size": int(world_size), "group_name": group_name, "backend": backend}, _json)

    destroy_weights_update_group = staticmethod(lambda group_name: _Spec(
        "POST", "/destroy_weights_update_group", {"group_name": group_name}, _json))

    @staticmethod
    def update_weights_from_distributed(names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
                                        version: str | None, flush_cache: bool, group_name: str) -> _Spec:
        body = {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                "group_name": group_name, "flush_cache": flush_cache, "abort_all_requests": False}
        if version is not None:
            body["weight_version"] = str(version)
        return _Spec("POST", "/update_weights_from_distributed", body, _json)

    @staticmethod
    def update_weights_from_tensor(serialized: Sequence[str], version: str | None, flush_cache: bool) -> _Spec:
        body = {"serialized_named_tensors": list(serialized), "load_format": None, "flush_cache": flush_cache,
                "abort_all_requests": False}
        if version is not None:
            body["weight_version"] = str(version)
        return _Spec("POST", "/update_weights_from_tensor", body, _json)


def _check(url: str, spec: _Spec, resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        raise EngineError(f"{url}{spec.path}: HTTP {resp.status_code}: {_error_message(resp)}",
                          resp.status_code, spec.path)
    return spec.parse(resp)


def _unreachable(url: str, spec: _Spec, exc: httpx.TransportError) -> EngineError:
    return EngineError(f"{url}{spec.path}: no answer ({type(exc).__name__}: {exc})", None, spec.path)


def _timeout(timeout: float, connect_timeout: float) -> httpx.Timeout:
    return httpx.Timeout(timeout, connect=connect_timeout)


#: Idle connections are dropped well before a server closes them: uvicorn (the local engine, SGLang) closes idle
#: keep-alive connections after 5 s, and a request sent on a connection it is closing fails with ReadError —
#: which the client must not retry (a /generate is never sent twice).
_LIMITS = httpx.Limits(keepalive_expiry=2.0)
KEEPALIVE = _LIMITS  # for other clients of gyre's uvicorn services (the harness's outcome posts)


class EngineClient:
    """Synchronous client of one engine URL (``http://host:port``)."""

    def __init__(self, url: str, timeout: float = 600.0, connect_retries: int = 3, connect_timeout: float = 5.0,
                 token: str | None = None):
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=_timeout(timeout, connect_timeout),
                                  transport=httpx.HTTPTransport(retries=connect_retries, limits=_LIMITS,
                                                                verify=tls.context()),
                                  headers=auth.bearer(token or auth.job_secret()))

    @classmethod
    def from_config(cls, url: str, cfg: EngineConfig) -> "EngineClient":
        """A client with ``engine.request_timeout_s`` and ``engine.connect_retries``."""
        return cls(url, timeout=cfg.request_timeout_s, connect_retries=cfg.connect_retries)

    def _call(self, spec: _Spec) -> Any:
        try:
            resp = self._http.request(spec.method, spec.path, json=spec.body)
        except httpx.TransportError as exc:
            raise _unreachable(self.url, spec, exc) from None
        return _check(self.url, spec, resp)

    def generate(self, input_ids: Sequence[int], sampling_params: dict | None = None, rid: str | None = None,
                 return_logprob: bool = True) -> GenerateResult:
        return self._call(_Specs.generate(input_ids, sampling_params, rid, return_logprob))

    def abort(self, rid: str) -> None:
        self._call(_Specs.abort(rid))

    def abort_all(self) -> None:
        self._call(_Specs.abort_all())

    def pause(self, mode: str = "abort") -> None:
        self._call(_Specs.pause(mode))

    def resume(self) -> None:
        self._call(_Specs.resume())

    def release_memory(self, tags: Sequence[str] | None = None) -> None:
        """Sleep (``/release_memory_occupation``; all memory types unless ``tags``); the engine must be idle."""
        self._call(_Specs.release_memory(tags))

    def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        """Wake (``/resume_memory_occupation``)."""
        self._call(_Specs.resume_memory(tags))

    def begin_weight_update(self) -> None:
        self._call(_Specs.begin_weight_update())

    def end_weight_update(self) -> None:
        self._call(_Specs.end_weight_update())

    def update_weights_from_disk(self, path: str, version: str | None = None, abort_all_requests: bool = False,
                                 flush_cache: bool = True) -> dict:
        return self._call(_Specs.update_weights_from_disk(path, version, abort_all_requests, flush_cache))

    def update_weight_version(self, version: str, abort_all_requests: bool = False) -> None:
        self._call(_Specs.update_weight_version(version, abort_all_requests))

    def init_weights_update_group(self, address: str, port: int, rank_offset: int, world_size: int,
                                  group_name: str, backend: str = "gloo") -> dict:
        """Join the weight-update group (blocks until the sender joined too: ``engines.weight_sync``)."""
        return self._call(_Specs.init_weights_update_group(address, port, rank_offset, world_size, group_name,
                                                           backend))

    def destroy_weights_update_group(self, group_name: str) -> dict:
        return self._call(_Specs.destroy_weights_update_group(group_name))

    def update_weights_from_tensor(self, serialized: Sequence[str], version: str | None = None,
                                   flush_cache: bool = False) -> dict:
        """Load tensors shared on this host (``engines.weight_tensor``: base64 pickles, one per TP rank)."""
        return self._call(_Specs.update_weights_from_tensor(serialized, version, flush_cache))

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], version: str | None = None,
                                        flush_cache: bool = False, group_name: str = "gyre_weights") -> dict:
        """Receive the tensors the sender broadcasts over the group (never aborts in-flight requests)."""
        return self._call(_Specs.update_weights_from_distributed(names, dtypes, shapes, version, flush_cache,
                                                                 group_name))

    def weight_version(self) -> str:
        return self._call(_Specs.weight_version())

    def model_info(self) -> dict:
        return self._call(_Specs.model_info())

    def server_info(self) -> dict:
        """Engine-specific facts and counters (the local engine: ``generated_tokens``, ``forward_calls``)."""
        return self._call(_Specs.server_info())

    def weights_checksum(self) -> str:
        return self._call(_Specs.weights_checksum())

    def loads(self) -> EngineLoad:
        return self._call(_Specs.loads())

    def flush_cache(self) -> None:
        self._call(_Specs.flush_cache())

    def health(self, timeout: float = 5.0) -> bool:
        """True when ``/health`` answers 200; never raises."""
        try:
            return self._http.get("/health", timeout=timeout).status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEngineClient:
    """``EngineClient``'s methods as coroutines (for an asyncio proxy)."""

    def __init__(self, url: str, timeout: float = 600.0, connect_retries: int = 3, connect_timeout: float = 5.0,
                 token: str | None = None):
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.url, timeout=_timeout(timeout, connect_timeout),
                                       transport=httpx.AsyncHTTPTransport(retries=connect_retries,
                                                                          limits=_LIMITS,
                                                                          verify=tls.context()),
                                       headers=auth.bearer(token or auth.job_secret()))

    @classmethod
    def from_config(cls, url: str, cfg: EngineConfig) -> "AsyncEngineClient":
        """A client with ``engine.request_timeout_s`` and ``engine.connect_retries``."""
        return cls(url, timeout=cfg.request_timeout_s, connect_retries=cfg.connect_retries)

    async def _call(self, spec: _Spec) -> Any:
        try:
            resp = await self._http.request(spec.method, spec.path, json=spec.body)
        except httpx.TransportError as exc:
            raise _unreachable(self.url, spec, exc) from None
        return _check(self.url, spec, resp)

    async def generate(self, input_ids: Sequence[int], sampling_params: dict | None = None, rid: str | None = None,
                       return_logprob: bool = True) -> GenerateResult:
        return await self._call(_Specs.generate(input_ids, sampling_params, rid, return_logprob))

    async def abort(self, rid: str) -> None:
        await self._call(_Specs.abort(rid))

    async def abort_all(self) -> None:
        await self._call(_Specs.abort_all())

    async def pause(self, mode: str = "abort") -> None:
        await self._call(_Specs.pause(mode))

    async def resume(self) -> None:
        await self._call(_Specs.resume())

    async def release_memory(self, tags: Sequence[str] | None = None) -> None:
        await self._call(_Specs.release_memory(tags))

    async def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        await self._call(_Specs.resume_memory(tags))

    async def update_weights_from_disk(self, path: str, version: str | None = None, abort_all_requests: bool = False,
                                       flush_cache: bool = True) -> dict:
        return await self._call(_Specs.update_weights_from_disk(path, version, abort_all_requests, flush_cache))

    async def begin_weight_update(self) -> None:
        await self._call(_Specs.begin_weight_update())

    async def end_weight_update(self) -> None:
        await self._call(_Specs.end_weight_update())

    async def update_weight_version(self, version: str, abort_all_requests: bool = False) -> None:
        await self._call(_Specs.update_weight_version(version, abort_all_requests))

    async def init_weights_update_group(self, address: str, port: int, rank_offset: int, world_size: int,
                                        group_name: str, backend: str = "gloo") -> dict:
        return await self._call(_Specs.init_weights_update_group(address, port, rank_offset, world_size,
                                                                 group_name, backend))

    async def destroy_weights_update_group(self, group_name: str) -> dict:
        return await self._call(_Specs.destroy_weights_update_group(group_name))

    async def update_weights_from_tensor(self, serialized: Sequence[str], version: str | None = None,
                                         flush_cache: bool = False) -> dict:
        return await self._call(_Specs.update_weights_from_tensor(serialized, version, flush_cache))

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], version: str | None = None,
                                              flush_cache: bool = False, group_name: str = "gyre_weights") -> dict:
        return await self._call(_Specs.update_weights_from_distributed(names, dtypes, shapes, version, flush_cache,
                                                                       group_name))

    async def weight_version(self) -> str:
        return await self._call(_Specs.weight_version())

    async def model_info(self) -> dict:
        return await self._call(_Specs.model_info())

    async def server_info(self) -> dict:
        return await self._call(_Specs.server_info())

    async def weights_checksum(self) -> str:
        return await self._call(_Specs.weights_checksum())

    async def flush_cache(self) -> None:
        await self._call(_Specs.flush_cache())

    async def loads(self) -> EngineLoad:
        return await self._call(_Specs.loads())

    async def health(self, timeout: float = 5.0) -> bool:
        try:
            return (await self._http.get("/health", timeout=timeout)).status_code == 200
        except httpx.TransportError:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()
