"""The local engine's paged KV cache is exact: the real scheduler and megatron policy, in this process, give the
same greedy tokens with ``engine.kv_cache`` as the recompute-everything path (the reference), and the cached
forward's logits match the full forward's within 1e-4, over prompts, batch sizes, prefix hits and evictions.
"""
import asyncio
import dataclasses

import numpy as np
import pytest
import torch

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.localengine import cached_forward
from gyre_hpc.localengine.policy import MegatronPolicy
from gyre_hpc.engines.protocol import parse_generate
from gyre_hpc.localengine.scheduler import Scheduler
from gyre_hpc.errors import EngineError

pytestmark = [pytest.mark.megatron]

MODEL = ModelConfig(kv_heads=2)  # grouped-query attention: 4 heads over 2 key/value groups
PLAIN = EngineConfig(max_running_requests=4, context_len=256)
CACHED = dataclasses.replace(PLAIN, kv_cache=True, kv_block_size=4, kv_pool_tokens=1024, kv_prefill_chunk=7)
RNG = np.random.default_rng(7)
SHARED = RNG.integers(0, 256, 21).tolist()  # a run's common prefix (5 full blocks of 4 and one token)
PROMPTS = [SHARED + RNG.integers(0, 256, n).tolist() for n in (1, 3, 8)] + [RNG.integers(0, 256, n).tolist()
                                                                            for n in (1, 2, 5, 16, 33)]


@pytest.fixture(scope="module")
def policy():
    return MegatronPolicy(MODEL, seed=0, threads=1)


def _request(prompt, new_tokens, rid=None):
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0}}
    if rid is not None:
        body["rid"] = rid
    return parse_generate(body, MODEL.vocab_size)


async def _with(sched, coro_fn):
    loop = asyncio.create_task(sched.run())
    try:
        return await coro_fn()
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


def _serve_rounds(sched, rounds, new_tokens=10):
    """Each round: every prompt at once; returns the answers of every round."""
    async def main():
        out = []
        for prompts in rounds:
            out.append(await asyncio.gather(*(sched.generate(_request(p, new_tokens)) for p in prompts)))
        return out
    return asyncio.run(_with(sched, main))


def _ids(rounds):
    return [[a["output_ids"] for a in answers] for answers in rounds]


@pytest.mark.parametrize("cfg", [ModelConfig(), ModelConfig(kv_heads=1, tie_embeddings=True),
                                 ModelConfig(position_embedding="learned_absolute", kv_heads=2)],
                         ids=["mrope-mha", "mrope-mqa-tied", "learned-gqa"])
def test_the_cached_forward_gives_the_full_forwards_logits_chunk_by_chunk(cfg):
    pol = MegatronPolicy(cfg, seed=1, threads=1)
    store = cached_forward.KVStore(pol.model, num_blocks=16, block_size=4)
    a, b = RNG.integers(0, 256, 23).tolist(), RNG.integers(0, 256, 6).tolist()
    table_a, table_b = [3, 0, 9, 4, 12, 1], [7, 2]
    got = []
    for lo, hi in ((0, 10), (10, 11), (11, 22), (22, 23)):  # prefill in chunks, then decode, batched with b
        items = [cached_forward.Item(a[lo:hi], lo, table_a)] + ([cached_forward.Item(b, 0, table_b)] if lo == 0 else [])
        got.append(cached_forward.forward(pol.model, store, items)[0].numpy()[: cfg.vocab_size])
        ref = pol.next_token_logits([a[:hi]])[0]
        assert np.abs(got[-1] - ref).max() <= 1e-4
    assert np.abs(cached_forward.forward(pol.model, store, [cached_forward.Item(b[5:], 5, table_b)])[0].numpy()
                  [: cfg.vocab_size] - pol.next_token_logits([b])[0]).max() <= 1e-4


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_greedy_tokens_are_identical_with_and_without_the_cache(policy, batch):
    rounds = [PROMPTS, PROMPTS[:3]]  # round 2 repeats the run's prompts: prefix hits
    want = _ids(_serve_rounds(Scheduler(policy, dataclasses.replace(PLAIN, max_running_requests=batch)), rounds))
    cached = Scheduler(policy, dataclasses.replace(CACHED, max_running_requests=batch))
    got = _serve_rounds(cached, rounds)
    assert _ids(got) == want
    assert all(a["meta_info"]["cached_tokens"] >= 20 for a in got[1])  # the shared 5 blocks at least
    assert cached.kv.blocks.hits > 0 and not cached.kv.blocks.seqs  # every request gave its blocks back


def test_greedy_tokens_are_identical_when_a_small_pool_evicts_and_queues(policy):
    rounds = [PROMPTS, PROMPTS, list(reversed(PROMPTS))]
    want = _ids(_serve_rounds(Scheduler(policy, PLAIN), rounds))
    small = Scheduler(policy, dataclasses.replace(CACHED, kv_pool_tokens=64))  # 16 blocks: < one round's needs
    got = _serve_rounds(small, rounds)
    assert _ids(got) == want
    assert small.kv.blocks.evictions > 0
    assert all(a["meta_info"]["finish_reason"]["type"] == "length" for r in got for a in r)


def test_a_request_that_could_never_fit_the_pool_is_refused_with_503(policy):
    sched = Scheduler(policy, dataclasses.replace(CACHED, kv_pool_tokens=16))

    async def main():
        with pytest.raises(EngineError) as err:
            sched.submit(_request(list(range(10)), 10))
        return err.value
    err = asyncio.run(_with(sched, main))
    assert err.status == 503 and "KV cache too small" in str(err) and "kv_pool_tokens" in str(err)


def test_a_weight_load_drops_the_prefix_cache_and_the_tokens_follow_the_new_weights(policy):
    other = MegatronPolicy(MODEL, seed=5, threads=1).state()
    prompt = PROMPTS[0]

    async def around_load(sched):
        first = await sched.generate(_request(prompt, 6))
        await sched.load_weights(other, "v1")
        second = await sched.generate(_request(prompt, 6))
        await sched.load_weights(policy.initial_state(), "0")
        return first, second
    plain_pol = MegatronPolicy(MODEL, seed=0, threads=1)
    p1, p2 = asyncio.run(_with(s := Scheduler(plain_pol, PLAIN), lambda: around_load(s)))
    c1, c2 = asyncio.run(_with(s := Scheduler(policy, CACHED), lambda: around_load(s)))
    assert (c1["output_ids"], c2["output_ids"]) == (p1["output_ids"], p2["output_ids"])
    assert c2["output_ids"] != c1["output_ids"] and c2["meta_info"]["cached_tokens"] == 0


def test_flush_forgets_the_prefix_cache(policy):
    sched = Scheduler(policy, CACHED)

    async def main():
        await sched.generate(_request(PROMPTS[0], 2))
        hit = await sched.generate(_request(PROMPTS[0], 2))
        sched.flush_kv()
        miss = await sched.generate(_request(PROMPTS[0], 2))
        return hit, miss
    hit, miss = asyncio.run(_with(sched, main))
    assert hit["meta_info"]["cached_tokens"] == 20 and miss["meta_info"]["cached_tokens"] == 0
    assert hit["output_ids"] == miss["output_ids"]


def test_the_cache_holds_the_models_dtype_and_kv_geometry(policy):
    store = cached_forward.KVStore(policy.model, num_blocks=3, block_size=8)
    assert store.k.shape == (MODEL.layers, 3, 8, 2, MODEL.hidden // MODEL.heads)
    assert store.k.dtype == torch.float32 and store.nbytes() == 2 * store.k.numel() * 4


def test_a_full_pool_makes_the_next_request_wait_for_blocks_not_fail(policy):
    a, b = RNG.integers(0, 256, 30).tolist(), RNG.integers(0, 256, 30).tolist()
    want = _ids(_serve_rounds(Scheduler(policy, PLAIN), [[a, b]]))
    tight = Scheduler(policy, dataclasses.replace(CACHED, kv_pool_tokens=64, kv_prefill_chunk=1024))
    got = _serve_rounds(tight, [[a, b]])  # each needs 10 of the 16 blocks: b runs after a released its own
    assert _ids(got) == want
    assert tight.forward_calls == 2 * 10  # one request at a time: 10 ticks each, never both in one tick


@pytest.mark.slow
def test_a_16k_token_context_decodes_exactly_on_the_cache():
    """A tiny model with RoPE positions past 16K: the cached engine's greedy tokens and logprobs equal the full
    forward's (computed here with the fused causal kernel, the only way 16K x 16K attention fits)."""
    from gyre_hpc.train.model import forward_logits

    cfg = ModelConfig(max_seq_len=16640, attention="sdpa", kv_heads=2)
    pol = MegatronPolicy(cfg, seed=0, threads=1)
    prompt = RNG.integers(0, 256, 16400).tolist()
    want, want_lp = [], []
    with torch.inference_mode():
        seq = list(prompt)
        for _ in range(2):
            row = forward_logits(pol.model, torch.tensor([seq]), torch.arange(len(seq)).unsqueeze(0), None)[0, -1]
            lp = torch.log_softmax(row[: cfg.vocab_size].float(), -1)
            want.append(int(lp.argmax()))
            want_lp.append(float(lp.max()))
            seq.append(want[-1])
    engine = dataclasses.replace(CACHED, context_len=16640, kv_pool_tokens=16640, kv_block_size=16,
                                 kv_prefill_chunk=2048)
    sched = Scheduler(pol, engine)

    async def main():
        req = parse_generate({"input_ids": prompt, "return_logprob": True,
                              "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}, cfg.vocab_size)
        return await sched.generate(req)
    got = asyncio.run(_with(sched, main))
    assert got["output_ids"] == want
    assert np.allclose([lp for lp, _, _ in got["meta_info"]["output_token_logprobs"]], want_lp, atol=1e-4)


def test_the_http_flush_cache_empties_the_prefix_cache_and_server_info_shows_the_pool(policy):
    from gyre_hpc.localengine.server import LocalEngine

    engine = LocalEngine(Scheduler(policy, CACHED), CACHED)

    async def main():
        await engine.s.generate(_request(PROMPTS[0], 2))
        before = await engine.server_info()
        flushed = await engine.flush_cache()
        return before, flushed, await engine.server_info()
    before, flushed, after = asyncio.run(_with(engine.s, main))
    assert flushed.status_code == 200
    # 22 prompt + 2 output tokens, K/V for 23 (the last token is never fed back): 5 full blocks of 4
    assert before["kv_blocks_cached"] == 5 and after["kv_blocks_cached"] == 0
    assert after["kv_blocks_free"] == after["kv_blocks"] == 256


def test_the_proxy_counts_the_engines_prefix_hits_of_a_run_that_sticks_to_its_engine(tmp_path, local_engine):
    """A real cached local engine behind the real proxy: a run's second call repeats its first call's context, the
    sticky route sends it to the same engine, and the proxy's stats carry the engine's cached_tokens."""
    from fastapi.testclient import TestClient

    from gyre_hpc.config import ProxyConfig
    from gyre_hpc.allocator.eventlog import EventLog
    from gyre_hpc.proxy.server import ProxyServer
    from gyre_hpc.proxy.service import ProxyService

    handle = local_engine(CACHED, MODEL, seed=0)
    service = ProxyService(ProxyConfig(), events=EventLog(tmp_path / "events.jsonl"))
    with TestClient(ProxyServer(service).app) as client:
        client.post("/admin/engines", json={"url": handle.url, "cell": 0, "name": "e0"})
        first = client.post("/generate", json={"input_ids": PROMPTS[0], "rid": "q0-r0/c0",
                                               "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}})
        context = PROMPTS[0] + first.json()["output_ids"] + [7, 8]
        second = client.post("/generate", json={"input_ids": context, "rid": "q0-r0/c1",
                                                "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}})
        assert first.status_code == second.status_code == 200
        stats = client.get("/admin/stats").json()
    assert stats["prompt_tokens"] == len(PROMPTS[0]) + len(context)
    assert stats["cached_tokens"] == 24  # the second call reuses 6 full blocks of 4 (25 of its 28 tokens had K/V)


def test_the_cached_forward_reads_qwen_style_attention_from_the_models_config():
    """q/k RMSNorm, a qkv bias and a head dim other than hidden/heads (Qwen3's kv_channels): the cache's geometry
    and the forward follow the model's TransformerConfig."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from gyre_hpc.train.model import forward_logits, init_parallel, quiet_megatron, transformer_config

    init_parallel()  # a no-op when another test built a model in this process
    with quiet_megatron():
        tc = dataclasses.replace(transformer_config(MODEL), qk_layernorm=True, add_qkv_bias=True, kv_channels=24,
                                 mrope_section=[4, 4, 4])
        torch.manual_seed(0)
        model = GPTModel(config=tc, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm",
                                                                                    qk_layernorm=True),
                         vocab_size=256, max_sequence_length=512, position_embedding_type="mrope").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "layernorm" in name:  # away from their zero / one init, so they matter
                p.add_(torch.randn_like(p) * 0.1)
    a = RNG.integers(0, 256, 19).tolist()
    mask = torch.triu(torch.ones(19, 19, dtype=torch.bool), 1).view(1, 1, 19, 19)
    with torch.inference_mode(), quiet_megatron():
        ref = forward_logits(model, torch.tensor([a]), torch.arange(19).unsqueeze(0), mask)[0, -1]
        store = cached_forward.KVStore(model, 8, 4)
        assert store.k.shape == (2, 8, 4, 2, 24)
        cached_forward.forward(model, store, [cached_forward.Item(a[:11], 0, [0, 1, 2, 3, 4])])
        got = cached_forward.forward(model, store, [cached_forward.Item(a[11:], 11, [0, 1, 2, 3, 4])])[0]
    assert (got - ref).abs().max() <= 1e-4


def test_an_abort_while_the_forward_runs_frees_the_request_and_the_others_are_unchanged(policy):
    import threading

    want = _ids(_serve_rounds(Scheduler(policy, PLAIN), [[PROMPTS[1]]]))[0][0]
    sched = Scheduler(policy, CACHED)
    started, go, forward = threading.Event(), threading.Event(), sched.kv.run

    def held_forward(plan):  # the real forward, held until the test has aborted one request
        started.set()
        go.wait()
        return forward(plan)
    sched.kv.run = held_forward

    async def main():
        victim = asyncio.ensure_future(sched.generate(_request(PROMPTS[0], 10, rid="victim")))
        other = asyncio.ensure_future(sched.generate(_request(PROMPTS[1], 10, rid="other")))
        await asyncio.to_thread(started.wait)
        assert sched.abort("victim") == 1 and "victim" not in sched.kv.blocks.seqs
        go.set()
        return await victim, await other
    victim, other = asyncio.run(_with(sched, main))
    assert victim["meta_info"]["finish_reason"]["type"] == "abort" and victim["output_ids"] == []
    assert other["output_ids"] == want
    assert not sched.kv.blocks.seqs and sched.kv.blocks.available() == sched.kv.blocks.num_blocks
