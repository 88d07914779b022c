"""The proxy's KV mover against engine doubles at the HTTP boundary (the real engines are in
tests/integration/test_kv_mover.py): every failure is a re-prefill with its reason logged once, the staging buffer
is released after any import attempt, and prepare never raises."""
import asyncio
import json

import httpx
import pytest

from gyre_hpc.proxy.events import proxy_log
from gyre_hpc.proxy.kvmover import KVMover
from gyre_hpc.proxy.moveplan import MovePlan
from gyre_hpc.proxy.movers import make_mover

TOKENS = tuple(range(11))
DESC = {"move_id": "kv0", "location": "127.0.0.1:1", "address": 1, "nbytes": 64, "tokens": list(range(8))}


def _plan(alive=True):
    return MovePlan("q0-r0/c0", "e0", "http://src", alive, "e1", "http://dst", TOKENS)


def _engines_double(import_answer, calls):
    """Source answers /kv/export with DESC and /kv/release; the target answers /kv/import with import_answer."""
    def handle(request: httpx.Request) -> httpx.Response:
        calls.append((request.url.host, request.url.path, json.loads(request.content or b"{}")))
        if request.url.path == "/kv/export":
            return httpx.Response(200, json=DESC)
        if request.url.path == "/kv/release":
            return httpx.Response(200, json={"released": True})
        return import_answer(request)
    return httpx.MockTransport(handle)


def _prepare(import_answer, alive=True, policy="reprefill"):
    calls, events = [], proxy_log(None)
    mover = KVMover(events, policy, transport=_engines_double(import_answer, calls))

    async def go():
        try:
            return await mover.prepare(_plan(alive))
        finally:
            await mover.aclose()
    return asyncio.run(go()), events, calls


def test_a_move_reports_the_blocks_the_target_took():
    cost, events, calls = _prepare(lambda r: httpx.Response(200, json={
        "moved_tokens": 8, "hit_tokens": 0, "blocks_written": 2, "bytes": 64}))
    assert (cost.moved_tokens, cost.reprefill_tokens) == (8, 3)
    assert [p for _, p, _ in calls] == ["/kv/export", "/kv/import", "/kv/release"]
    assert calls[1][2] == {"descriptor": DESC, "keep_version": False} and calls[2][2] == {"move_id": "kv0"}
    assert [e["event"] for e in events.events] == ["kv_move"]


@pytest.mark.parametrize("answer, reason", [
    (lambda r: httpx.Response(503, json={"error": {"message": "KV cache full", "reason": "target_full"}}),
     "target_full"),
    (lambda r: httpx.Response(409, json={"error": {"message": "checksum mismatch", "reason": "checksum_mismatch"}}),
     "checksum_mismatch"),
    (lambda r: httpx.Response(409, json={"error": {"message": "version", "reason": "version_mismatch"}}),
     "version_mismatch"),
    (lambda r: (_ for _ in ()).throw(httpx.ReadError("connection reset")), "transfer_error"),  # target died
    (lambda r: httpx.Response(500, text="Internal Server Error"), "transfer_error"),
])
def test_a_refused_or_broken_import_falls_back_to_reprefill_with_its_reason(answer, reason):
    cost, events, calls = _prepare(answer)
    assert (cost.moved_tokens, cost.reprefill_tokens) == (0, len(TOKENS))
    (fb,) = events.events
    assert (fb["event"], fb["reason"]) == ("kv_fallback", reason)
    assert calls[-1][1] == "/kv/release"  # the source's staging buffer is freed after a failed import too


def test_an_engine_without_kv_routes_and_a_dead_source_fall_back_without_a_transfer():
    calls, events = [], proxy_log(None)
    sglang_like = httpx.MockTransport(lambda r: calls.append(r.url.path) or httpx.Response(404, json={
        "detail": "Not Found"}))
    mover = KVMover(events, transport=sglang_like)
    assert asyncio.run(mover.prepare(_plan())).reprefill_tokens == len(TOKENS)
    assert asyncio.run(mover.prepare(_plan(alive=False))).moved_tokens == 0
    assert calls == ["/kv/export"]  # nothing asked of a dead source
    assert [e["reason"] for e in events.events] == ["no_kv_cache", "source_dead"]


def test_the_keep_policy_asks_the_target_to_keep_other_weights_and_kv_is_the_default_mover():
    _, _, calls = _prepare(lambda r: httpx.Response(200, json={
        "moved_tokens": 8, "hit_tokens": 0, "blocks_written": 2, "bytes": 64}), policy="keep")
    assert calls[1][2]["keep_version"] is True
    assert make_mover("kv").name == "kv"
