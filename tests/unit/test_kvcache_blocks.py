"""The paged KV cache's bookkeeping (gyre_hpc.localengine.kvcache): tables, prefix hits, ref counts, LRU, refusal."""
import pytest

from gyre_hpc.localengine.kvcache import BlockManager, KVPoolFull, block_hash

B = 4


def _states_partition(m: BlockManager) -> None:
    free, lru = set(m.free), set(m.lru)
    referenced = {b for b in range(m.num_blocks) if m.ref[b] > 0}
    assert free | lru | referenced == set(range(m.num_blocks))
    assert not (free & lru) and not (free & referenced) and not (lru & referenced)
    assert set(m.hash_of) >= lru


def _run(m: BlockManager, rid: str, tokens, version="v0", capacity=None):
    seq = m.acquire(rid, tokens, version, capacity)
    m.computed(rid, tokens, version)
    return seq


def test_a_table_holds_ceil_of_tokens_over_block_size_and_the_capacity():
    m = BlockManager(16, B)
    assert len(m.acquire("a", list(range(9)), "v0").table) == 3
    assert len(m.acquire("b", list(range(9)), "v0", capacity=13).table) == 4
    _states_partition(m)


def test_a_released_prefix_is_reused_and_counted_as_cached_tokens():
    m = BlockManager(16, B)
    first = _run(m, "a", list(range(10)))
    m.release("a")
    again = m.acquire("b", list(range(10)) + [77, 78], "v0")
    assert again.cached_tokens == 8 and again.table[:2] == first.table[:2]
    _states_partition(m)


def test_a_block_is_reused_only_under_the_same_full_prefix():
    m = BlockManager(16, B)
    _run(m, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    m.release("a")
    # the second block's tokens match, the first's do not: no hit at all (the hash chains over the prefix)
    assert m.acquire("b", [0, 2, 3, 4, 5, 6, 7, 8, 9], "v0").cached_tokens == 0


def test_a_block_is_reused_only_under_the_same_weight_version():
    m = BlockManager(16, B)
    _run(m, "a", list(range(9)), version="v0")
    m.release("a")
    assert m.acquire("b", list(range(9)), "v1").cached_tokens == 0
    assert block_hash(b"", [1, 2], "v0") != block_hash(b"", [1, 2], "v1")


def test_the_block_holding_the_last_token_is_never_a_hit():
    m = BlockManager(16, B)
    _run(m, "a", list(range(8)))
    m.release("a")
    assert m.acquire("b", list(range(8)), "v0").cached_tokens == 4  # 8 tokens: only the first block is a hit


def test_blocks_computed_under_other_weights_are_not_published():
    m = BlockManager(16, B)
    m.acquire("a", list(range(8)), "v0", capacity=12)
    m.computed("a", list(range(9)), "v1")  # a weight load happened while "a" was running
    m.release("a")
    assert not m.by_hash and len(m.free) == 16


def test_eviction_takes_the_least_recently_released_cached_block_and_never_a_referenced_one():
    m = BlockManager(4, B)
    a = _run(m, "a", list(range(5)))        # blocks: 1 full (hashed) + 1 partial
    b = _run(m, "b", list(range(100, 105)))
    m.release("a")
    m.release("b")                            # LRU: a's full block, then b's
    assert len(m.lru) == 2 and len(m.free) == 2
    c = m.acquire("c", list(range(200, 211)), "v0")  # 3 blocks: 2 free + the oldest cached (a's)
    assert a.table[0] in c.table and b.table[0] not in c.table and m.evictions == 1
    m.release("c")
    assert m.acquire("d", list(range(100, 105)), "v0").cached_tokens == 4  # b's prefix survived
    _states_partition(m)


def test_a_full_pool_refuses_with_a_503_and_changes_nothing():
    m = BlockManager(4, B)
    _run(m, "a", list(range(5)))
    m.release("a")
    hold = m.acquire("h", list(range(300, 308)), "v0")
    before = (list(m.free), list(m.lru), list(m.ref), dict(m.by_hash))
    with pytest.raises(KVPoolFull) as err:
        m.acquire("big", list(range(5)) + [9] * 8, "v0")  # 13 tokens: 4 blocks, 1 is a hit, 3 needed, 2 left
    assert err.value.status == 503 and "KV cache full" in str(err.value)
    assert (list(m.free), list(m.lru), list(m.ref), dict(m.by_hash)) == before and "big" not in m.seqs
    assert hold.table and m.ref[hold.table[0]] == 1


def test_a_shared_prefix_is_referenced_twice_and_survives_one_release():
    m = BlockManager(8, B)
    _run(m, "a", list(range(9)))
    m.release("a")
    x = m.acquire("x", list(range(9)) + [50], "v0")
    y = m.acquire("y", list(range(9)) + [60], "v0")
    assert x.table[:2] == y.table[:2] and m.ref[x.table[0]] == 2
    m.release("x")
    assert m.ref[x.table[0]] == 1 and x.table[0] not in m.lru
    _states_partition(m)


def test_flush_forgets_every_prefix_and_frees_unreferenced_blocks():
    m = BlockManager(8, B)
    _run(m, "a", list(range(9)))
    m.release("a")
    held = _run(m, "h", list(range(40, 49)))
    assert m.flush() == 2
    assert not m.by_hash and not m.lru and m.acquire("b", list(range(9)), "v0").cached_tokens == 0
    m.release("h")
    assert all(b in m.free for b in held.table)
    _states_partition(m)
