"""Paged KV-cache bookkeeping: a fixed pool of blocks, a block table per request, a prefix cache of hashed full
blocks with reference counts and LRU eviction. Pure (stdlib only): the K/V tensors live in ``cached_forward``;
this module decides which block holds which token.

A sequence of ``n`` tokens with block size ``B`` occupies ``ceil(n / B)`` blocks; token ``t`` lives in block
``table[t // B]`` at slot ``t % B``::

    tokens   a b c d | e f g h | i j
    table    [  7    ,    2    ,  9  ]      B = 4: blocks 7 and 2 are full, block 9 holds 2 tokens
    hashes   h7 = H(root, v, abcd); h2 = H(h7, v, efgh); block 9 is not hashed (not full)

A full block's hash chains over its parent's hash, its own tokens and the weight version ``v`` that computed it,
so a block is reused only under the same full prefix and the same weights.

Invariants
- A block is in exactly one state: free, referenced (``ref > 0``), or cached-unreferenced (in the LRU, hashed).
- ``acquire`` reuses the longest chain of hashed full blocks that prefix the tokens (never the block holding the
  last token: at least one token is computed, so the request gets logits), and reports it as ``cached_tokens``.
- Eviction takes only cached-unreferenced blocks, least recently released first; a referenced block is never
  evicted or overwritten.
- When the pool cannot give the blocks a request needs, ``KVPoolFull`` is raised and nothing changes (the
  request's own references taken in that call are returned).
- ``flush()`` drops every hash (no later prefix hit) and frees every unreferenced block.
"""
from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass, field
from typing import Sequence

from gyre_hpc.errors import EngineError


class KVPoolFull(EngineError):
    """The KV pool has no free or evictable block for a request (HTTP 503)."""

    def __init__(self, message: str):
        super().__init__(message, status=503)


def block_hash(parent: bytes, tokens: Sequence[int], version: str) -> bytes:
    """The chained hash of a full block: its parent's hash, the weight version, and its tokens."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(version.encode())
    h.update(b"\0")
    h.update(",".join(map(str, tokens)).encode())
    return h.digest()


ROOT = b""


@dataclass
class SeqBlocks:
    """One request's block table: ``computed`` tokens have K/V in the pool; ``hashes[i]`` is block i's hash once
    it is full and registered (``None`` until then)."""

    table: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    computed: int = 0
    cached_tokens: int = 0
    version: str = ""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.free: collections.deque[int] = collections.deque(range(num_blocks))
        self.by_hash: dict[bytes, int] = {}
        self.hash_of: dict[int, bytes] = {}
        self.lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # cached, unreferenced
        self.seqs: dict[str, SeqBlocks] = {}
        self.hits = 0  # blocks reused from the prefix cache
        self.evictions = 0

    # ------------------------------------------------------------------------------------------ queries
    def available(self) -> int:
        """Blocks a request could get now: free plus evictable."""
        return len(self.free) + len(self.lru)

    def used_tokens(self) -> int:
        return sum(s.computed for s in self.seqs.values())

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    # ------------------------------------------------------------------------------------------ changes
    def _take(self) -> int:
        if self.free:
            return self.free.popleft()
        block, _ = self.lru.popitem(last=False)  # least recently released
        del self.by_hash[self.hash_of.pop(block)]
        self.evictions += 1
        return block

    def _release(self, block: int) -> None:
        self.ref[block] -= 1
        if self.ref[block] == 0:
            if block in self.hash_of:
                self.lru[block] = None
            else:
                self.free.append(block)

    def acquire(self, rid: str, tokens: Sequence[int], version: str, capacity: int | None = None) -> SeqBlocks:
        """A new block table for ``rid`` holding ``tokens`` and room for ``capacity`` tokens in all (default: the
        tokens): reuse hashed full-block prefixes, allocate the rest now (decode then never runs out of blocks)."""
        if rid in self.seqs:
            raise ValueError(f"request {rid!r} already holds blocks")
        B = self.block_size
        hits: list[int] = []
        hashes: list[bytes] = []
        parent = ROOT
        for i in range((len(tokens) - 1) // B):  # full blocks strictly before the last token
            h = block_hash(parent, tokens[i * B:(i + 1) * B], version)
            block = self.by_hash.get(h)
            if block is None:
                break
            hits.append(block)
            hashes.append(h)
            parent = h
        need = self.blocks_for(max(len(tokens), capacity or 0)) - len(hits)
        reusable_in_lru = sum(1 for b in hits if self.ref[b] == 0)
        if need > self.available() - reusable_in_lru:
            raise KVPoolFull(f"KV cache full: a request of {len(tokens)} tokens (room for {capacity or len(tokens)}) "
                             f"needs {need} more blocks of "
                             f"{B} tokens, {self.available() - reusable_in_lru} of {self.num_blocks} are free")
        for b in hits:
            if self.ref[b] == 0:
                del self.lru[b]
            self.ref[b] += 1
        seq = SeqBlocks(table=list(hits), hashes=hashes, computed=len(hits) * B, cached_tokens=len(hits) * B,
                        version=version)
        for _ in range(need):
            b = self._take()
            self.ref[b] = 1
            seq.table.append(b)
        self.hits += len(hits)
        self.seqs[rid] = seq
        return seq

    def computed(self, rid: str, tokens: Sequence[int], version: str) -> None:
        """``tokens`` of ``rid`` now have K/V in the pool; register its newly full blocks in the prefix cache
        (only when computed under ``version``, the weights the request's cached blocks were computed with)."""
        seq = self.seqs[rid]
        seq.computed = len(tokens)
        if version != seq.version:
            return  # mixed weights: these blocks must never serve as a prefix
        B = self.block_size
        while len(seq.hashes) < len(tokens) // B:
            i = len(seq.hashes)
            h = block_hash(seq.hashes[-1] if seq.hashes else ROOT, tokens[i * B:(i + 1) * B], version)
            seq.hashes.append(h)
            block = seq.table[i]
            if h not in self.by_hash and block not in self.hash_of:
                self.by_hash[h] = block
                self.hash_of[block] = h

    def release(self, rid: str) -> None:
        """``rid`` is done: its blocks lose a reference; hashed ones stay cached (LRU), the others are freed."""
        seq = self.seqs.pop(rid, None)
        if seq is None:
            return
        for b in reversed(seq.table):  # the deepest block is released first: evicted before its parents
            self._release(b)

    def flush(self) -> int:
        """Forget every prefix hash and free every unreferenced cached block; returns how many blocks were freed."""
        freed = list(self.lru)
        self.lru.clear()
        self.free.extend(freed)
        self.by_hash.clear()
        self.hash_of.clear()
        return len(freed)
