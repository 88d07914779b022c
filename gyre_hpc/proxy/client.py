"""A synchronous client of the proxy: the harness's ``generate`` (with ``query_id``) and the runtime's admin calls.

The harness may equally use ``gyre_hpc.engines.client.EngineClient`` on the proxy URL (SGLang's protocol); it
then cannot pass ``query_id``, which defaults to the run id up to its first ``-``.

Invariant: every refusal is a ``ProxyError`` carrying the proxy's HTTP status and message (``status`` None when
the proxy did not answer).
"""
from __future__ import annotations

from typing import Any, Sequence

import httpx

from gyre_hpc.net import auth, tls
from gyre_hpc.engines.protocol import GenerateResult
from gyre_hpc.proxy.routing import ProxyError


class ProxyClient:
    def __init__(self, url: str, timeout: float = 600.0, token: str | None = None):
        """``token``: the job secret (default ``$GYRE_JOB_SECRET``) or a run key, sent as a Bearer token."""
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout, verify=tls.context(),
                                  headers=auth.bearer(token or auth.job_secret()))

    def _call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        try:
            resp = self._http.request(method, path, json=body, params=params or None)
        except httpx.TransportError as exc:
            err = ProxyError(f"{self.url}{path}: no answer ({type(exc).__name__}: {exc})")
            err.status = None
            raise err from None
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:300]
            raise ProxyError(f"{self.url}{path}: HTTP {resp.status_code}: {message}", resp.status_code)
        return resp.json()

    # ----------------------------------------------------------------------------------------------- harness
    def generate(self, input_ids: Sequence[int], rid: str, sampling_params: dict | None = None,
                 return_logprob: bool = True, query_id: str | None = None) -> GenerateResult:
        body = {"input_ids": [int(t) for t in input_ids], "rid": rid, "sampling_params": dict(sampling_params or {}),
                "return_logprob": return_logprob}
        if query_id is not None:
            body["query_id"] = query_id
        return GenerateResult.from_response(self._call("POST", "/generate", body))

    def abort(self, rid: str) -> int:
        return self._call("POST", "/abort_request", {"rid": rid})["aborted"]

    def outcome(self, run_id: str, status: str, score: float | None, query_id: str | None = None,
                detail: str = "") -> dict:
        body = {"run_id": run_id, "status": status, "score": score, "detail": detail}
        return self._call("POST", "/tito/outcome", {**body, **({"query_id": query_id} if query_id else {})})

    # ------------------------------------------------------------------------------------------------- admin
    def add_engine(self, url: str, cell: int, name: str | None = None) -> dict:
        return self._call("POST", "/admin/engines", {"url": url, "cell": cell, **({"name": name} if name else {})})

    def engines(self) -> list[dict]:
        return self._call("GET", "/admin/engines")["engines"]

    def drain(self, engine: str | None = None, cell: int | None = None, timeout_s: float | None = None) -> dict:
        body = _target(engine, cell)
        return self._call("POST", "/admin/drain", {**body, **({"timeout_s": timeout_s} if timeout_s else {})})

    def mark_dead(self, engine: str | None = None, cell: int | None = None, reason: str = "reported dead") -> dict:
        return self._call("POST", "/admin/dead", {**_target(engine, cell), "reason": reason})

    def remove(self, engine: str | None = None, cell: int | None = None) -> dict:
        return self._call("POST", "/admin/remove", _target(engine, cell))

    def stats(self) -> dict:
        return self._call("GET", "/admin/stats")

    def events(self, since: int = 0) -> list[dict]:
        return self._call("GET", "/admin/events", since=since)["events"]

    def flush_tito(self, name: str, run_ids: Sequence[str] | None = None,
                   outcomes: Sequence[dict] | None = None) -> dict:
        """Flush the runs' records into the file ``name`` of the proxy's TITO directory (``proxy.tito_dir``);
        ``outcomes`` (outcome records of exactly those runs) are written unless the proxy holds them already
        (docs/proxy.md)."""
        body = {"name": name, "run_ids": None if run_ids is None else list(run_ids)}
        if outcomes is not None:
            body["outcomes"] = [{k: v for k, v in o.items() if k != "type"} for o in outcomes]
        return self._call("POST", "/admin/flush_tito", body)

    def loads(self) -> dict:
        return self._call("GET", "/v1/loads")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ProxyClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _target(engine: str | None, cell: int | None) -> dict:
    return {"engine": engine} if engine is not None else {"cell": cell}
