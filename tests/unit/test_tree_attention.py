"""The blockwise tree-attention kernel equals dense masked attention in value and gradients (real torch, CPU)."""
import numpy as np
import pytest
import torch

from gyre_hpc.train.tree_attention import _tiles, dense_reference, tree_attention


def random_spans(rng, T, pad=0):
    """A random forest in pre-order over T - pad positions, then ``pad`` padding positions (span_end = i)."""
    n = T - pad
    parent = np.full(n, -1)
    for i in range(1, n):
        parent[i] = -1 if rng.random() < 0.02 else int(rng.integers(max(0, i - 8), i))
    # pre-order needs each node's subtree contiguous: build children lists, then re-serialise depth-first
    kids = [[] for _ in range(n)]
    for i in range(1, n):
        if parent[i] >= 0:
            kids[parent[i]].append(i)
    span = np.arange(T)
    order, stack = [], [r for r in range(n) if parent[r] < 0][::-1]
    while stack:
        x = stack.pop()
        order.append(x)
        stack.extend(kids[x][::-1])
    pos = {x: i for i, x in enumerate(order)}
    ends = np.arange(n)

    def end(x):
        e = pos[x]
        for c in kids[x]:
            e = max(e, end(c))
        ends[pos[x]] = e
        return e

    import sys
    sys.setrecursionlimit(10000)
    for r in [r for r in range(n) if parent[r] < 0]:
        end(r)
    span[:n] = ends
    return span


def grads(fn, q, k, v):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device, out.dtype)
    (out * w).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("T,block,hq,hk,pad", [(37, 8, 4, 2, 5), (64, 16, 2, 2, 0), (130, 32, 6, 2, 3),
                                               (50, 512, 2, 1, 4)])
def test_blockwise_kernel_equals_dense_masked_attention_forward_and_backward(T, block, hq, hk, pad):
    rng = np.random.default_rng(T)
    span = torch.from_numpy(np.stack([random_spans(rng, T, pad), random_spans(rng, T, 0)]))
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, h, T, 8, generator=g) for h in (hq, hk, hk))
    scale = 0.3
    ref = grads(lambda a, b, c: dense_reference(a, b, c, span, scale), q, k, v)
    got = grads(lambda a, b, c: tree_attention(a, b, c, span, scale, block=block, backend="blockwise"), q, k, v)
    for a, b in zip(got, ref):
        assert rel(a, b) <= 1e-5


def test_tiles_skip_keys_no_query_of_the_tile_can_see():
    # two chains of 64 in one row: the second chain's queries never see the first chain's keys
    span = torch.tensor([[63] * 64 + [127] * 64])
    tiles = _tiles(span, 128, 32)
    assert [len(keys) for _, _, keys in tiles] == [1, 2, 1, 2]
    # strictly-below-diagonal tiles of one chain need no mask
    assert tiles[1][2][0] == (0, 32, True) and tiles[1][2][1] == (32, 64, False)


def test_causal_spans_equal_torch_causal_attention():
    T = 70
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, 16, generator=g) for _ in range(3))
    out = tree_attention(q, k, v, torch.full((1, T), T - 1), block=16, backend="blockwise")
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert rel(out, want) <= 1e-5


def flex_case(device):
    rng = np.random.default_rng(5)
    T = 200
    span = torch.from_numpy(np.stack([random_spans(rng, T, 7), random_spans(rng, T, 0)])).to(device)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, T, 16, generator=g).to(device) for h in (4, 2, 2))
    return q, k, v, span


def test_flex_attention_with_the_block_mask_from_span_end_equals_dense_attention():
    """FlexAttention (eager on the CPU, forward only: torch has no CPU backward for it) over the BlockMask built
    from span_end's tile lists, T not a multiple of its block: the dense reference's values."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from gyre_hpc.train.tree_attention import _flex

    q, k, v, span = flex_case("cpu")
    with torch.no_grad():
        assert rel(_flex(q, k, v, span, 0.25, compiled=False), dense_reference(q, k, v, span, 0.25)) <= 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_flex_tree_attention_equals_dense_attention_forward_and_backward_on_cuda():
    q, k, v, span = flex_case("cuda")
    ref = grads(lambda a, b, c: dense_reference(a, b, c, span, 0.25), q, k, v)
    got = grads(lambda a, b, c: tree_attention(a, b, c, span, 0.25, backend="flex"), q, k, v)
    for a, b in zip(got, ref):
        assert rel(a, b) <= 1e-4  # TF32 matmuls may be on for the reference
