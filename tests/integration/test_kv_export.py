"""A run's KV blocks exported from one paged decoder and imported into another (gyre_hpc.localengine.kvexport): the
continuation after the move equals the unmoved one, with no prefill; corrupt, stale or misfitting bundles are
refused and leave the target unchanged."""
import dataclasses

import numpy as np
import pytest

from gyre_hpc.config import ModelConfig
from gyre_hpc.localengine.kvexport import export_blocks, import_blocks
from gyre_hpc.localengine.policy import MegatronPolicy
from gyre_hpc.errors import TransferError

pytestmark = [pytest.mark.megatron]

MODEL = ModelConfig(kv_heads=2)
PROMPT = np.random.default_rng(3).integers(0, 256, 37).tolist()


@pytest.fixture(scope="module")
def policy():
    return MegatronPolicy(MODEL, seed=0, threads=1)


def _decode(dec, rid, tokens, n):
    """n greedy tokens of rid on dec; returns the tokens and each step's logits."""
    tokens, rows = list(tokens), []
    for _ in range(n):
        row = dec.step([(rid, tokens)])[0]
        dec.commit([(rid, tokens)], "0")
        rows.append(row)
        tokens.append(int(row.argmax()))
    return tokens, rows


def _moved(policy, block_size=4):
    src = policy.paged(block_size, 256)
    src.admit("r", PROMPT, len(PROMPT) + 12, "0")
    tokens, _ = _decode(src, "r", PROMPT, 5)
    return src, tokens, export_blocks(src, "r", tokens)


def test_the_continuation_after_a_move_equals_the_unmoved_one_without_prefill(policy):
    src, tokens, bundle = _moved(policy)
    assert len(bundle.tokens) == len(tokens) - 1 and bundle.nbytes == bundle.data.size
    dst = policy.paged(4, 256)
    assert import_blocks(dst, "r", tokens, bundle, len(PROMPT) + 12, "0") == 0
    assert dst.blocks.seqs["r"].computed == len(tokens) - 1  # the next step feeds one token
    moved, moved_rows = _decode(dst, "r", tokens, 6)
    unmoved, unmoved_rows = _decode(src, "r", tokens, 6)
    assert moved == unmoved
    assert max(np.abs(a - b).max() for a, b in zip(moved_rows, unmoved_rows)) <= 1e-5
    assert np.abs(policy.next_token_logits([moved[:-1]])[0] - moved_rows[-1]).max() <= 1e-4


def test_an_import_keeps_the_targets_own_prefix_hits(policy):
    _, tokens, bundle = _moved(policy)
    dst = policy.paged(4, 256)
    dst.admit("other", PROMPT[:20], 24, "0")
    dst.step([("other", PROMPT[:20])])
    dst.commit([("other", PROMPT[:20])], "0")
    dst.release("other")
    assert import_blocks(dst, "r", tokens, bundle, len(PROMPT) + 12, "0") == 20  # 5 full blocks already there
    moved = _decode(dst, "r", tokens, 3)[0]
    ref = list(tokens)
    for _ in range(3):
        ref.append(int(policy.next_token_logits([ref])[0].argmax()))
    assert moved == ref


@pytest.mark.parametrize("spoil, message", [
    (lambda b: dataclasses.replace(b, data=_flipped(b.data)), "checksum mismatch"),
    (lambda b: dataclasses.replace(b, tokens=b.tokens[:-1] + (b.tokens[-1] ^ 1,)), "checksum mismatch"),
])
def test_a_corrupt_bundle_is_refused_and_the_target_is_unchanged(policy, spoil, message):
    _, tokens, bundle = _moved(policy)
    dst = policy.paged(4, 256)
    free = list(dst.blocks.free)
    with pytest.raises(TransferError, match=message):
        import_blocks(dst, "r", tokens, spoil(bundle), len(PROMPT) + 12, "0")
    assert list(dst.blocks.free) == free and not dst.blocks.seqs


def test_a_bundle_of_other_weights_or_another_geometry_is_refused(policy):
    _, tokens, bundle = _moved(policy)
    with pytest.raises(TransferError, match="weight version '0', the target serves '1'"):
        import_blocks(policy.paged(4, 256), "r", tokens, bundle, len(PROMPT) + 12, "1")
    with pytest.raises(TransferError, match="geometry"):
        import_blocks(policy.paged(8, 256), "r", tokens, bundle, len(PROMPT) + 12, "0")


def _flipped(data):
    out = data.copy()
    out[len(out) // 2] ^= 0xFF
    return out
