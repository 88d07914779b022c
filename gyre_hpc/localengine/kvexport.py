"""A run's KV blocks as one buffer: export from one ``PagedDecoder``, import into another (the building block of
the KV mover: the buffer is what a Mooncake batched transfer carries between engines).

A bundle holds the K/V of a request's first ``len(tokens)`` tokens (those already fed through the model), the
weight version that computed them, the cache geometry, and a checksum over geometry, version, tokens and bytes::

    request tokens   t0 .. t9 t10         (t10 sampled, not fed yet: no K/V)
    bundle.tokens    t0 .. t9             K/V of 10 tokens = ceil(10 / B) blocks, block order, K then V
    import           acquire(t0 .. t10) on the target (its prefix-cache hits are kept), copy the other blocks,
                     computed = 10: the next step feeds t10 only (no prefill)

Invariants
- ``import_blocks`` refuses (``TransferError``, the target unchanged) a bundle whose checksum does not match, whose
  version is not the target's current version, or whose geometry (layers, groups, head dim, block size, dtype)
  differs; the caller then re-prefills.
- After an import, decoding on the target gives the same logits as on the source (same weights): the blocks hold
  the same K/V at the same positions.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from gyre_hpc.localengine.paged import PagedDecoder
from gyre_hpc.errors import TransferError


@dataclass(frozen=True)
class KVBundle:
    tokens: tuple[int, ...]
    version: str
    block_size: int
    shape: tuple[int, ...]  # (2, layers, blocks, block_size, groups, head_dim): K then V
    dtype: str
    data: np.ndarray  # uint8, contiguous: the bytes a transfer moves
    checksum: str

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def _digest(tokens: Sequence[int], version: str, block_size: int, shape, dtype: str, data: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((tuple(tokens), version, block_size, tuple(shape), dtype)).encode())
    h.update(memoryview(data))
    return h.hexdigest()


def export_blocks(dec: PagedDecoder, rid: str, tokens: Sequence[int]) -> KVBundle:
    """The K/V of ``rid``'s computed tokens (``tokens`` is the request's token list; its computed prefix is kept)."""
    seq = dec.blocks.seqs[rid]
    n = seq.computed
    nb = dec.blocks.blocks_for(n)
    idx = torch.as_tensor(seq.table[:nb])
    kv = torch.stack([dec.store.k[:, idx], dec.store.v[:, idx]]).contiguous()
    data = kv.cpu().view(torch.uint8).numpy().reshape(-1).copy()
    dtype = str(kv.dtype).removeprefix("torch.")
    shape = tuple(kv.shape)
    kept = tuple(int(t) for t in tokens[:n])
    return KVBundle(kept, seq.version, dec.blocks.block_size, shape, dtype, data,
                    _digest(kept, seq.version, dec.blocks.block_size, shape, dtype, data))


def import_blocks(dec: PagedDecoder, rid: str, tokens: Sequence[int], bundle: KVBundle, capacity: int,
                  version: str) -> int:
    """Give ``rid`` (holding ``tokens``, which extend ``bundle.tokens``) blocks on ``dec`` filled from ``bundle``;
    returns the tokens the target's own prefix cache already held."""
    store = dec.store
    want = (2, store.k.shape[0], dec.blocks.blocks_for(len(bundle.tokens)), *store.k.shape[2:])
    dtype = str(store.k.dtype).removeprefix("torch.")
    if _digest(bundle.tokens, bundle.version, bundle.block_size, bundle.shape, bundle.dtype,
               bundle.data) != bundle.checksum:
        raise TransferError(f"KV bundle of {rid!r}: checksum mismatch ({len(bundle.tokens)} tokens)")
    if bundle.version != version:
        raise TransferError(f"KV bundle of {rid!r}: weight version {bundle.version!r}, the target serves {version!r}")
    if (bundle.block_size, tuple(bundle.shape), bundle.dtype) != (dec.blocks.block_size, want, dtype):
        raise TransferError(f"KV bundle of {rid!r}: geometry {bundle.block_size}, {list(bundle.shape)}, "
                            f"{bundle.dtype} does not fit the target's {dec.blocks.block_size}, {list(want)}, {dtype}")
    if tuple(tokens[:len(bundle.tokens)]) != bundle.tokens or len(tokens) <= len(bundle.tokens):
        raise TransferError(f"KV bundle of {rid!r}: its tokens are not a proper prefix of the request's")
    seq = dec.blocks.acquire(rid, tokens, version, capacity)
    hit_blocks = seq.cached_tokens // dec.blocks.block_size
    kv = torch.from_numpy(bundle.data).view(store.k.dtype).reshape(bundle.shape)
    idx = torch.as_tensor(seq.table[hit_blocks:want[2]])
    store.k[:, idx] = kv[0, :, hit_blocks:].to(store.k.device)
    store.v[:, idx] = kv[1, :, hit_blocks:].to(store.v.device)
    dec.blocks.computed(rid, bundle.tokens, version)
    return seq.cached_tokens
