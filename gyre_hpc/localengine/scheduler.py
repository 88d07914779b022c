"""Continuous batching for the local engine: one asyncio loop owns every request; the model runs in a thread.

Each decode tick admits waiting requests (FIFO) up to ``max_running_requests``, runs ONE forward over all running
requests (``EngineModel.next_token_logits``, padded, causal), samples one token for each, and finishes those that hit
a stop token, EOS (neither with ignore_eos, as SGLang), or their length. HTTP handlers (abort, pause, loads,
weight updates) run on the same event loop between ticks, so request state is only ever touched by one thread.

States of a request: waiting → running → finished (length | stop | abort); ``retract`` moves running back to the
front of the waiting queue with its tokens kept (and its KV blocks, with ``engine.kv_cache``).

With ``engine.kv_cache`` the tick runs on a paged KV cache (``gyre_hpc.localengine.paged``): a request gets its blocks
when it starts running (a prefix hit counts as ``meta_info.cached_tokens``); when the pool is short the head of the
queue waits; a weight load drops the prefix cache.

Invariants
- A tick and a weight load never overlap (one ``asyncio.Lock``), and every output token records the weight
  version that was loaded for the whole forward that produced it; ``weight_versions`` spans follow from that.
- A finished request is resolved exactly once and leaves every queue; an abort resolves it with the tokens it
  has (partial output, ``finish_reason.type == "abort"``), also while a forward for it is in flight (that
  forward's token is dropped).
- While memory is released (``released``, the engine sleeps) every new request is refused with 503.
- While paused, no token is generated: ``pause`` returns only after an in-flight tick has ended.
- At most ``max_running_requests`` requests are running; a request never holds more than ``context_len`` tokens.
- With ``device_tick_s > 0`` a tick over n requests lasts at least ``device_tick_s * (1 + n / device_half_load)``
  seconds (an emulated accelerator: the loop sleeps the rest, so engines sharing a CPU stop competing for it);
  the tokens are the same as without it.
"""
from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import EngineConfig
from gyre_hpc.localengine.policy import EngineModel
from gyre_hpc.engines.protocol import (
    GenerateRequest,
    EngineRequestError,
    finish_abort,
    finish_length,
    finish_stop,
    generate_response,
)
from gyre_hpc.localengine.sampling import sample
from gyre_hpc.errors import EngineError


@dataclass(eq=False)
class _Running:
    req: GenerateRequest
    max_new: int
    rng: np.random.Generator
    future: asyncio.Future
    t0: float  # on the scheduler's clock, when the request came
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    cached_tokens: int = 0

    def tokens(self) -> list[int]:
        return [*self.req.input_ids, *self.output_ids]


class Scheduler:
    def __init__(self, policy: EngineModel, cfg: EngineConfig, seed: int = 0, clock: Clock | None = None):
        self.policy = policy
        self.clock = clock or WallClock()  # e2e latencies and the device-tick floor
        self.cfg = cfg
        self.version = cfg.initial_weight_version
        self.paused: str | None = None
        self.released: frozenset[str] = frozenset()  # memory released (release_memory_occupation): no generation
        self.waiting: collections.deque[_Running] = collections.deque()
        self.running: list[_Running] = []
        self._active: dict[str, _Running] = {}
        self._lock = asyncio.Lock()
        self._work = asyncio.Event()
        self._seeds = np.random.SeedSequence(seed)
        self.generated_tokens = 0
        self.forward_calls = 0
        # engine.kv_cache: decode on a paged KV cache (gyre_hpc.localengine.paged); None = recompute every tick
        self.kv = (policy.paged(cfg.kv_block_size, cfg.kv_pool_tokens, cfg.kv_prefill_chunk)
                   if cfg.kv_cache else None)

    # ------------------------------------------------------------------------------------------ requests
    def submit(self, req: GenerateRequest) -> asyncio.Future:
        """Queue ``req``; the future resolves to its ``/generate`` answer."""
        if req.rid in self._active:
            raise EngineRequestError("rid", f"request {req.rid!r} is already running")
        if self.released:
            raise EngineError(f"engine memory released ({', '.join(sorted(self.released))}): "
                              "/resume_memory_occupation first", status=503)
        room = self.cfg.context_len - len(req.input_ids)
        if room < 1:
            raise EngineRequestError("input_ids", f"{len(req.input_ids)} tokens do not fit the context length "
                                             f"{self.cfg.context_len} (at least one output token)")
        if self.kv is not None:
            self.kv.check_fits(len(req.input_ids) + min(req.sampling.max_new_tokens, room))
        if len(self.waiting) >= self.cfg.max_waiting_requests:
            raise EngineError(f"engine overloaded: {len(self.waiting)} requests waiting", status=503)
        seed = req.sampling.sampling_seed
        rng = np.random.default_rng(self._seeds.spawn(1)[0] if seed is None else seed)
        r = _Running(req, min(req.sampling.max_new_tokens, room), rng, asyncio.get_running_loop().create_future(),
                     self.clock.now())
        self._active[req.rid] = r
        self.waiting.append(r)
        if r.max_new == 0:
            self._finish(r, finish_length(0))
        self._work.set()
        return r.future

    async def generate(self, req: GenerateRequest) -> dict:
        return await self.submit(req)

    def abort(self, rid: str | None = None, abort_all: bool = False, message: str = "aborted by request") -> int:
        """Finish the matching requests with what they have; returns how many were aborted."""
        victims = list(self._active.values()) if abort_all else [self._active[rid]] if rid in self._active else []
        for r in victims:
            self._finish(r, finish_abort(message))
        return len(victims)

    def _finish(self, r: _Running, finish: dict) -> None:
        self._active.pop(r.req.rid, None)
        if self.kv is not None:
            self.kv.release(r.req.rid)
        if r in self.running:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
        if not r.future.done():
            r.future.set_result(generate_response(
                r.req.rid, len(r.req.input_ids), r.output_ids, r.logprobs if r.req.return_logprob else None,
                r.versions, self.version, finish, self.clock.now() - r.t0, r.cached_tokens))

    # ------------------------------------------------------------------------------------------- control
    async def pause(self, mode: str) -> None:
        self.paused = mode
        if mode == "abort":
            self.abort(abort_all=True, message="aborted by pause_generation")
        elif mode == "retract":
            self.waiting.extendleft(reversed(self.running))
            self.running.clear()
        async with self._lock:  # an in-flight tick ends before pause returns
            pass

    def resume(self) -> None:
        self.paused = None
        self._work.set()

    async def exclusive(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` in a thread with no tick in flight (checksums)."""
        async with self._lock:
            return await asyncio.to_thread(fn)

    async def load_weights(self, state: Mapping[str, object], version: str | None) -> None:
        """Load ``state`` between two ticks; the next tick's tokens carry ``version`` (when given)."""
        async with self._lock:
            await asyncio.to_thread(self.policy.load_weights, state)
            if self.kv is not None:
                self.kv.invalidate()  # cached K/V belong to the weights that computed them
            if version is not None:
                self.version = version

    async def release_memory(self, tags: tuple[str, ...]) -> None:
        """Sleep: refuse new requests; ``weights`` frees the policy's weights. The engine must be idle."""
        if self.running or self.waiting:
            raise EngineError("requests are running or waiting: pause generation and let them finish (or abort "
                              "them) before releasing memory", status=400)
        async with self._lock:
            if "weights" in tags and "weights" not in self.released:
                await asyncio.to_thread(self.policy.release_weights)
            self.released |= set(tags)

    async def resume_memory(self, tags: tuple[str, ...], reload: Callable[[], Mapping[str, object]]) -> None:
        """Wake: released weights get storage again and ``reload()``'s state (the version is unchanged)."""
        async with self._lock:
            if "weights" in tags and "weights" in self.released:
                def restore() -> None:
                    self.policy.allocate_weights()
                    self.policy.load_weights(reload())
                await asyncio.to_thread(restore)
            self.released -= set(tags)

    def busy(self) -> bool:
        """True when a cache flush must be refused: something runs, or waits without being paused."""
        return bool(self.running) or (bool(self.waiting) and self.paused is None)

    def loads(self) -> tuple[int, int, int]:
        """(running, waiting, tokens held by running requests)."""
        return len(self.running), len(self.waiting), sum(len(r.req.input_ids) + len(r.output_ids)
                                                         for r in self.running)

    # ---------------------------------------------------------------------------------------------- loop
    async def run(self) -> None:
        """The decode loop; runs until cancelled, then aborts whatever is left."""
        try:
            while True:
                if self.paused is not None or not (self.waiting or self.running):
                    self._work.clear()
                    await self._work.wait()
                    continue
                await self._tick()
                await asyncio.sleep(0)  # let handlers in between ticks
        finally:
            self.abort(abort_all=True, message="engine shutting down")

    async def _tick(self) -> None:
        while self.waiting and len(self.running) < self.cfg.max_running_requests:
            if self.kv is not None and not self._admit_kv(self.waiting[0]):
                break  # the KV pool is short: the head waits for running requests to release blocks
            self.running.append(self.waiting.popleft())
        async with self._lock:
            batch, version = list(self.running), self.version
            if not batch:
                return
            t0 = self.clock.now()
            if self.kv is None:
                logits = await asyncio.to_thread(self.policy.next_token_logits, [r.tokens() for r in batch])
            else:
                work = [(r.req.rid, r.tokens()) for r in batch]
                logits = await asyncio.to_thread(self.kv.run, self.kv.plan(work))
                self.kv.commit(work, version)
            if self.cfg.device_tick_s > 0:
                floor = self.cfg.device_tick_s * (1.0 + len(batch) / self.cfg.device_half_load)
                await asyncio.sleep(floor - (self.clock.now() - t0))
            self.forward_calls += 1
            for r, row in zip(batch, logits):
                if r.req.rid in self._active and self._active[r.req.rid] is r:
                    self._advance(r, row, version)

    def _admit_kv(self, r: _Running) -> bool:
        """Give ``r`` its KV blocks (prefix hit + room for its whole length); False when the pool is short."""
        from gyre_hpc.localengine.kvcache import KVPoolFull

        try:
            r.cached_tokens = self.kv.admit(r.req.rid, r.tokens(), len(r.req.input_ids) + r.max_new, self.version)
        except KVPoolFull as e:
            if not self.running:  # nothing will release blocks: answer rather than wait forever
                self._finish(r, finish_abort(str(e)))
            return False
        return True

    def flush_kv(self) -> None:
        """``/flush_cache``: forget the prefix cache (the caller checked ``busy()``)."""
        if self.kv is not None:
            self.kv.flush()

    def _advance(self, r: _Running, row: np.ndarray, version: str) -> None:
        sp = r.req.sampling
        # as SGLang (Req._check_token_based_finish): ignore_eos turns off every stop token, stop_token_ids included
        eos = self.cfg.eos_token_id
        stops = set() if sp.ignore_eos else set(sp.stop_token_ids) | ({eos} if eos is not None else set())
        suppressed = sorted(stops) if len(r.output_ids) < sp.min_new_tokens else ()
        token, logprob = sample(row, sp, r.rng, suppressed)
        r.output_ids.append(token)
        r.logprobs.append(logprob)
        r.versions.append(version)
        self.generated_tokens += 1
        if token in stops:
            self._finish(r, finish_stop(token))
        elif len(r.output_ids) >= r.max_new:
            self._finish(r, finish_length(len(r.output_ids)))
