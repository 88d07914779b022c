"""A moved request's KV blocks through the prefix cache (gyre_hpc.localengine.kvprefix): the source's cached full
blocks, imported into the target's prefix cache, turn the unchanged continuation into a prefix hit whose greedy
tokens equal the unmoved run's; corrupt, stale or unfitting bundles are refused and leave the target unchanged."""
import dataclasses

import numpy as np
import pytest

from gyre_hpc.config import ModelConfig
from gyre_hpc.localengine.kvcache import KVPoolFull
from gyre_hpc.localengine.kvprefix import bundle_from, describe, export_prefix, import_prefix
from gyre_hpc.localengine.policy import MegatronPolicy
from gyre_hpc.errors import TransferError

pytestmark = [pytest.mark.megatron]

MODEL = ModelConfig(kv_heads=2)
PROMPT = np.random.default_rng(5).integers(0, 256, 29).tolist()


@pytest.fixture(scope="module")
def policy():
    return MegatronPolicy(MODEL, seed=0, threads=1)


def _greedy(dec, rid, tokens, n, capacity=64):
    """n greedy tokens of a fresh request rid on dec (admitted, decoded, released); returns (tokens, cached)."""
    tokens = list(tokens)
    cached = dec.admit(rid, tokens, capacity, "0")
    for _ in range(n):
        row = dec.step([(rid, tokens)])[0]
        dec.commit([(rid, tokens)], "0")
        tokens.append(int(row.argmax()))
    dec.release(rid)  # as an abort on the source: full blocks stay in the prefix cache
    return tokens, cached


def _source(policy, block_size=4):
    src = policy.paged(block_size, 256)
    cut, _ = _greedy(src, "r", PROMPT, 6)  # the request is cut after 6 tokens
    return src, cut, export_prefix(src, cut, "0")


def test_a_moved_continuation_is_a_prefix_hit_with_the_unmoved_greedy_tokens(policy):
    src, cut, bundle = _source(policy)
    assert len(bundle.tokens) == (len(cut) - 1) // 4 * 4  # whole blocks strictly before the last token
    wire = bundle_from(describe(bundle), bundle.data.copy())  # what the transfer delivers
    dst = policy.paged(4, 256)
    done = import_prefix(dst, wire, "0")
    assert done == {"moved_tokens": len(bundle.tokens), "hit_tokens": 0, "blocks_written": len(bundle.tokens) // 4}
    assert not dst.blocks.seqs and len(dst.blocks.lru) == len(bundle.tokens) // 4
    moved, cached = _greedy(dst, "c", cut, 8)
    assert cached == len(bundle.tokens) and len(cut) - cached <= 4  # no prefill: at most one block recomputed
    unmoved, _ = _greedy(src, "u", cut, 8)
    assert moved == unmoved
    ref = list(cut)
    for _ in range(8):
        ref.append(int(policy.next_token_logits([ref])[0].argmax()))
    assert moved == ref


def test_an_import_keeps_the_targets_own_hits_and_never_evicts_its_chain(policy):
    _, cut, bundle = _source(policy)
    nb = len(bundle.tokens) // 4
    dst = policy.paged(4, 4 * (nb + 1))  # room for the chain and one block more
    _greedy(dst, "o", PROMPT[:13], 1, capacity=16)  # 3 full blocks of the prompt are cached there
    done = import_prefix(dst, bundle, "0")
    assert (done["hit_tokens"], done["blocks_written"]) == (12, nb - 3)
    assert _greedy(dst, "c", cut, 1, capacity=len(cut) + 1)[1] == len(bundle.tokens)


def test_a_full_target_refuses_the_import_unchanged(policy):
    _, cut, bundle = _source(policy)
    dst = policy.paged(4, 16)  # 4 blocks: fewer than the chain
    before = (list(dst.blocks.free), dict(dst.blocks.by_hash))
    with pytest.raises(KVPoolFull, match="KV cache full"):
        import_prefix(dst, bundle, "0")
    assert (list(dst.blocks.free), dict(dst.blocks.by_hash)) == before


@pytest.mark.parametrize("spoil", [
    lambda b: dataclasses.replace(b, data=_flipped(b.data)),
    lambda b: dataclasses.replace(b, tokens=b.tokens[:-1] + (b.tokens[-1] ^ 1,)),
])
def test_a_corrupt_bundle_is_refused_as_a_checksum_mismatch(policy, spoil):
    _, _, bundle = _source(policy)
    dst = policy.paged(4, 256)
    with pytest.raises(TransferError, match="checksum mismatch"):
        import_prefix(dst, spoil(bundle), "0")
    assert not dst.blocks.by_hash and len(dst.blocks.free) == dst.blocks.num_blocks


def test_other_weights_are_refused_unless_the_policy_keeps_them(policy):
    _, cut, bundle = _source(policy)
    dst = policy.paged(4, 256)
    with pytest.raises(TransferError, match="version mismatch"):
        import_prefix(dst, bundle, "1")
    with pytest.raises(TransferError, match="geometry"):
        import_prefix(policy.paged(8, 256), bundle, "0")
    import_prefix(dst, bundle, "1", keep_version=True)  # registered under the target's version
    assert dst.admit("c", cut, 64, "1") == len(bundle.tokens)


def test_nothing_cached_exports_nothing(policy):
    assert export_prefix(policy.paged(4, 256), PROMPT, "0") is None
    src, cut, _ = _source(policy)
    assert export_prefix(src, cut, "1") is None  # cached under other weights


def _flipped(data):
    out = data.copy()
    out[len(out) // 2] ^= 0xFF
    return out
