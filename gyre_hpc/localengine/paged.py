"""The local engine's decode on a paged KV cache: block bookkeeping (``kvcache``) plus K/V tensors and the cached
forward (``cached_forward``), behind the calls the scheduler makes.

The scheduler calls ``admit`` when a request starts running (prefix hit + blocks for its whole length, or
``KVPoolFull``: it keeps waiting), ``plan`` then ``run`` for each tick (``run`` in a worker thread: the forward
only, over a snapshot of the tables; an abort meanwhile only drops that request's row), ``commit``
after the tick (on the event loop: the new tokens' blocks join the prefix cache), and ``release`` when it ends.

Invariants
- A request admitted with ``capacity`` tokens never needs another block: decode cannot run the pool out.
- ``step`` computes only tokens without K/V: the uncached suffix at the first tick (prefill, in chunks of at most
  ``prefill_chunk`` tokens per request and forward), then one token.
- Cached blocks are tagged with the weight version that computed them: ``invalidate`` (after a weight load)
  drops every prefix hash, so no later request reuses K/V of older weights. Requests running across a load
  keep their own K/V (as SGLang does) but never publish blocks computed under mixed weights.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from gyre_hpc.localengine import cached_forward
from gyre_hpc.localengine.kvcache import BlockManager, KVPoolFull
from gyre_hpc.train.model import quiet_megatron


class PagedDecoder:
    def __init__(self, model: torch.nn.Module, vocab_size: int, block_size: int, pool_tokens: int,
                 prefill_chunk: int = 1024):
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.vocab_size = vocab_size
        self.blocks = BlockManager(-(-pool_tokens // block_size), block_size)
        self.store = cached_forward.KVStore(model, self.blocks.num_blocks, block_size)

    @property
    def capacity_tokens(self) -> int:
        return self.blocks.num_blocks * self.blocks.block_size

    def check_fits(self, capacity: int) -> None:
        """``KVPoolFull`` when a request of ``capacity`` tokens could not fit even an empty pool."""
        if self.blocks.blocks_for(capacity) > self.blocks.num_blocks:
            raise KVPoolFull(f"KV cache too small: a request of up to {capacity} tokens needs "
                             f"{self.blocks.blocks_for(capacity)} blocks, the pool has {self.blocks.num_blocks} "
                             f"(engine.kv_pool_tokens={self.capacity_tokens})")

    def admit(self, rid: str, tokens: Sequence[int], capacity: int, version: str) -> int:
        """Blocks for ``rid`` (idempotent: a retracted request keeps its blocks); returns its cached tokens."""
        seq = self.blocks.seqs.get(rid)
        if seq is None:
            seq = self.blocks.acquire(rid, tokens, version, capacity)
        return seq.cached_tokens

    def step(self, batch: Sequence[tuple[str, Sequence[int]]]) -> np.ndarray:
        """Logits ``[len(batch), vocab]`` after each request's tokens (``plan`` then ``run``)."""
        return self.run(self.plan(batch))

    def plan(self, batch: Sequence[tuple[str, Sequence[int]]]) -> list[tuple[Sequence[int], int, list[int]]]:
        """A snapshot of each request's (tokens, first position without K/V, block table), taken on the thread
        that owns the bookkeeping, so ``run`` in a worker thread never reads it while a request is released."""
        plan = []
        for rid, tokens in batch:
            seq = self.blocks.seqs[rid]
            plan.append((list(tokens), seq.computed, list(seq.table)))
        return plan

    def run(self, plan: Sequence[tuple[Sequence[int], int, list[int]]]) -> np.ndarray:
        """Compute the planned tokens without K/V, in forwards of at most ``prefill_chunk`` tokens per request
        (a long prompt's attention stays ``chunk x context``, never ``context x context``)."""
        todo = dict(enumerate(plan))  # batch index -> (tokens, first position without K/V, table)
        out = np.zeros((len(plan), self.vocab_size), dtype=np.float32)
        while todo:
            order = list(todo)
            items = []
            for i in order:
                tokens, start, table = todo[i]
                items.append(cached_forward.Item(tokens[start:start + self.prefill_chunk], start, table))
            with quiet_megatron():
                logits = cached_forward.forward(self.model, self.store, items)
            for i, item, row in zip(order, items, logits):
                tokens, start, table = todo.pop(i)
                end = start + len(item.ids)
                if end < len(tokens):
                    todo[i] = (tokens, end, table)
                else:
                    out[i] = row[: self.vocab_size].float().cpu().numpy()
        return out

    def commit(self, batch: Sequence[tuple[str, Sequence[int]]], version: str) -> None:
        """The tokens of ``batch`` now have K/V (requests released meanwhile are skipped)."""
        for rid, tokens in batch:
            if rid in self.blocks.seqs:
                self.blocks.computed(rid, tokens, version)

    def release(self, rid: str) -> None:
        self.blocks.release(rid)

    def flush(self) -> int:
        return self.blocks.flush()

    def invalidate(self) -> None:
        """The weights changed: no cached block may serve a prefix any more."""
        self.blocks.flush()

    def stats(self) -> dict:
        b = self.blocks
        return {"kv_block_size": b.block_size, "kv_blocks": b.num_blocks, "kv_blocks_free": len(b.free),
                "kv_blocks_cached": len(b.lru), "kv_prefix_hit_blocks": b.hits, "kv_evictions": b.evictions}
