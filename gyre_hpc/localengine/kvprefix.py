"""A moved run's KV blocks through the prefix cache: export the cached full blocks of a token prefix from one
``PagedDecoder``, import them as cached blocks of another (what the proxy's KV mover carries between engines).

When the proxy moves a request, the source has already aborted it: its running table is gone, but its full blocks
stay hashed in the prefix cache (LRU). The mover exports them, and the target's import registers them in ITS
prefix cache, so the unchanged continuation ``/generate {prompt + partial}`` is a prefix hit there::

    continuation     t0 .. t8 t9 t10          B = 4, 11 tokens
    exported         [t0..t3][t4..t7]          the full blocks strictly before the last token (acquire's rule)
    target computes  t8 t9 t10                 fewer than B + 1 tokens: no prefill

Invariants
- ``import_prefix`` refuses (``TransferError``) a bundle whose checksum does not match, whose geometry does not fit,
  or whose weight version differs from the target's unless ``keep_version`` (then the blocks are registered under
  the target's version: the run keeps K/V of its old weights, see docs/proxy.md); nothing changes on a refusal.
- A target without room for the blocks raises ``KVPoolFull`` and is unchanged; an import never evicts a block of
  the chain it imports, nor a referenced block.
- Imported blocks are cached-unreferenced (LRU, most recent): nothing runs on them until a request hits them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from gyre_hpc.localengine.kvcache import ROOT, KVPoolFull, block_hash
from gyre_hpc.localengine.kvexport import KVBundle, _digest
from gyre_hpc.localengine.paged import PagedDecoder
from gyre_hpc.errors import TransferError


def _chain(dec: PagedDecoder, tokens: Sequence[int], version: str) -> list[tuple[bytes, int | None]]:
    """(hash, cached block or None) of each full block strictly before the last token, in order."""
    B, out, parent = dec.blocks.block_size, [], ROOT
    for i in range((len(tokens) - 1) // B):
        parent = block_hash(parent, tokens[i * B:(i + 1) * B], version)
        out.append((parent, dec.blocks.by_hash.get(parent)))
    return out


def export_prefix(dec: PagedDecoder, tokens: Sequence[int], version: str) -> KVBundle | None:
    """The K/V of the longest cached chain of full blocks prefixing ``tokens`` (None when nothing is cached)."""
    blocks = []
    for _, block in _chain(dec, tokens, version):
        if block is None:
            break
        blocks.append(block)
    if not blocks:
        return None
    idx = torch.as_tensor(blocks)
    kv = torch.stack([dec.store.k[:, idx], dec.store.v[:, idx]]).contiguous()
    data = kv.cpu().view(torch.uint8).numpy().reshape(-1).copy()
    dtype, shape = str(kv.dtype).removeprefix("torch."), tuple(kv.shape)
    kept = tuple(int(t) for t in tokens[:len(blocks) * dec.blocks.block_size])
    return KVBundle(kept, version, dec.blocks.block_size, shape, dtype, data,
                    _digest(kept, version, dec.blocks.block_size, shape, dtype, data))


def import_prefix(dec: PagedDecoder, bundle: KVBundle, version: str, keep_version: bool = False) -> dict:
    """Register ``bundle``'s blocks in ``dec``'s prefix cache under ``version``; returns
    ``{"moved_tokens": tokens now cached, "hit_tokens": tokens the target already held, "blocks_written": n}``."""
    store, B = dec.store, dec.blocks.block_size
    nb = len(bundle.tokens) // B
    want = (2, store.k.shape[0], nb, *store.k.shape[2:])
    dtype = str(store.k.dtype).removeprefix("torch.")
    if _digest(bundle.tokens, bundle.version, bundle.block_size, bundle.shape, bundle.dtype,
               bundle.data) != bundle.checksum:
        raise TransferError(f"KV bundle: checksum mismatch ({len(bundle.tokens)} tokens)")
    if bundle.version != version and not keep_version:
        raise TransferError(f"KV bundle: weight version mismatch: {bundle.version!r}, the target serves {version!r}")
    if (bundle.block_size, tuple(bundle.shape), bundle.dtype, len(bundle.tokens)) != (B, want, dtype, nb * B):
        raise TransferError(f"KV bundle: geometry {bundle.block_size}, {list(bundle.shape)}, {bundle.dtype} does "
                            f"not fit the target's {B}, {list(want)}, {dtype}")
    bm = dec.blocks
    chain = _chain(dec, bundle.tokens + (0,), version)  # + one token: every bundle block is strictly before it
    missing = [i for i, (_, block) in enumerate(chain) if block is None]
    hits_in_lru = [block for _, block in chain if block is not None and bm.ref[block] == 0]
    if len(missing) > len(bm.free) + len(bm.lru) - len(hits_in_lru):
        raise KVPoolFull(f"KV cache full: importing {len(missing)} blocks of {B} tokens, "
                         f"{len(bm.free) + len(bm.lru) - len(hits_in_lru)} of {bm.num_blocks} are free")
    for block in hits_in_lru:
        bm.lru.move_to_end(block)  # the chain's own blocks are evicted last
    kv = torch.from_numpy(bundle.data).view(store.k.dtype).reshape(bundle.shape)
    taken = [bm._take() for _ in missing]
    if taken:  # one indexed copy per K and V (not one per block)
        src, dst = torch.as_tensor(missing), torch.as_tensor(taken)
        store.k[:, dst] = kv[0][:, src].to(store.k.device)
        store.v[:, dst] = kv[1][:, src].to(store.v.device)
    for i, block in zip(missing, taken):
        h = chain[i][0]
        bm.by_hash[h], bm.hash_of[block] = block, h
        bm.lru[block] = None
    return {"moved_tokens": nb * B, "hit_tokens": (nb - len(missing)) * B, "blocks_written": len(missing)}


def bundle_from(meta: dict, data: np.ndarray) -> KVBundle:
    """A ``KVBundle`` from its JSON description (``describe``) and the bytes a transfer delivered."""
    return KVBundle(tuple(int(t) for t in meta["tokens"]), str(meta["version"]), int(meta["block_size"]),
                    tuple(int(s) for s in meta["shape"]), str(meta["dtype"]), data, str(meta["checksum"]))


def describe(bundle: KVBundle) -> dict:
    return {"tokens": list(bundle.tokens), "version": bundle.version, "block_size": bundle.block_size,
            "shape": list(bundle.shape), "dtype": bundle.dtype, "checksum": bundle.checksum,
            "nbytes": bundle.nbytes}
