"""``proxy.mover: kv``: a moved request's KV blocks go from the leaving engine to the target over Mooncake Transfer
Engine, so the continuation is a prefix-cache hit there instead of a re-prefill.

    1. POST source /kv/export {tokens: plan.tokens}   the source stages its cached full blocks in a registered
                                                     buffer (after the abort they are still in its prefix cache)
    2. POST target /kv/import {descriptor}            the target pulls them with ONE batched Mooncake read,
                                                     checks checksum, weight version and geometry, and registers
                                                     them in its prefix cache
    3. POST source /kv/release {move_id}              the staging buffer is freed (also after a failure)

The continuation request itself is unchanged (``movers.py``): greedy tokens are the same either way, only what the
target recomputes changes. Sampling parameters travel with the continuation, as with re-prefill.

Invariants
- ``prepare`` never raises: every failure is a fallback to re-prefill (``reprefill_tokens == len(plan.tokens)``)
  logged once as a ``kv_fallback`` event with its reason: ``source_dead``, ``no_kv_cache`` (an engine without
  ``engine.kv_cache`` or without /kv routes, e.g. SGLang), ``nothing_cached``, ``version_mismatch``,
  ``checksum_mismatch``, ``geometry``, ``target_full``, ``transfer_error``.
- ``reprefill_tokens + moved_tokens == len(plan.tokens)``; ``moved_tokens`` are whole blocks strictly before the
  continuation's last token.
- ``kv_version_policy``: ``reprefill`` refuses blocks of another weight version (the target recomputes under its
  weights); ``keep`` registers them under the target's version (docs/proxy.md, "KV moves and weight versions").
"""
from __future__ import annotations

import httpx

from gyre_hpc.net import auth, tls
from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.allocator.eventlog import EventLog
from gyre_hpc.proxy.moveplan import MoveCost, MovePlan


class KVFallback(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class KVMover:
    name = "kv"

    def __init__(self, events: EventLog, version_policy: str = "reprefill", timeout_s: float = 120.0,
                 token: str | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 clock: Clock | None = None):
        self.events = events
        self.clock = clock or WallClock()  # the moves' seconds
        self.keep_version = version_policy == "keep"
        self._http = httpx.AsyncClient(timeout=timeout_s, headers=auth.bearer(token or auth.job_secret()),
                                       transport=transport, verify=tls.context())

    async def _post(self, url: str, path: str, body: dict) -> dict:
        try:
            resp = await self._http.post(url.rstrip("/") + path, json=body)
        except httpx.HTTPError as exc:
            raise KVFallback("transfer_error", f"{path} on {url}: {type(exc).__name__}: {exc}") from None
        if resp.status_code == 404 and "reason" not in resp.text:
            raise KVFallback("no_kv_cache", f"{url} has no {path} (not a local engine)")
        if resp.status_code != 200:
            try:
                err = resp.json()["error"]
                raise KVFallback(err.get("reason", "transfer_error"), err.get("message", resp.text))
            except (ValueError, KeyError, TypeError):
                raise KVFallback("transfer_error", f"{path} on {url}: HTTP {resp.status_code}") from None
        return resp.json()

    async def prepare(self, plan: MovePlan) -> MoveCost:
        t0 = self.clock.now()
        try:
            done = await self._move(plan)
        except KVFallback as fb:
            self.events.write("kv_fallback", rid=plan.rid, from_engine=plan.source, to_engine=plan.target,
                              reason=fb.reason, message=str(fb), tokens=len(plan.tokens))
            return MoveCost(len(plan.tokens), 0, self.clock.now() - t0)
        moved = int(done["moved_tokens"])
        self.events.write("kv_move", rid=plan.rid, from_engine=plan.source, to_engine=plan.target,
                          moved_tokens=moved, hit_tokens=int(done["hit_tokens"]), bytes=int(done["bytes"]),
                          seconds=self.clock.now() - t0)
        return MoveCost(len(plan.tokens) - moved, moved, self.clock.now() - t0)

    async def _move(self, plan: MovePlan) -> dict:
        if not plan.source_alive:
            raise KVFallback("source_dead", f"engine {plan.source} died: its KV blocks are gone")
        desc = await self._post(plan.source_url, "/kv/export", {"tokens": list(plan.tokens)})
        try:
            return await self._post(plan.target_url, "/kv/import",
                                    {"descriptor": desc, "keep_version": self.keep_version})
        finally:
            try:
                await self._post(plan.source_url, "/kv/release", {"move_id": desc["move_id"]})
            except KVFallback:
                pass  # the source left meanwhile: its staging buffer went with it

    async def aclose(self) -> None:
        await self._http.aclose()
