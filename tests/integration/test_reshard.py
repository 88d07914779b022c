"""Weights resharded on their way (gyre_hpc/train/reshard.py): a TP 2 trainer (two spawned gloo ranks) streams its
weights bucket by bucket into a real local engine, whose logprobs then match the trainer's forward; a PP 2 trainer's
buckets equal the single-rank export bit for bit; a bucket smaller than one layer works and bounds every rank's
materialised bytes."""
import numpy as np
import pytest
import torch

from train_batches import fork_pair

from gyre_hpc.config import ModelConfig
from gyre_hpc.train.reshard import Entry, plan_buckets

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

MODEL = dict(heads=4, kv_heads=2)  # grouped-query attention: q/k/v are split per query group after the gather
GROUPS = [(2, 5, [3, 4, 2], 1.0), (1, 6, [2, 5], -0.5)]
BUCKET = 128 << 10  # the largest tensor (linear_fc1, 128 KiB); one layer holds ~240 KiB
PROMPT = [5, 17, 42, 99, 3]


def _entry(name: str, n: int) -> Entry:
    return Entry(name, name, 0, (n,), "float32", None, False)


def test_plan_buckets_covers_every_tensor_once_in_order_and_bounds_each_bucket():
    sizes = [10, 30, 5, 70, 20, 20, 200, 1]
    entries = [_entry(f"t{i}", n) for i, n in enumerate(sizes)]
    plan = plan_buckets(entries, 100 * 4)
    assert [e for b in plan for e in b] == entries
    assert [[e.name for e in b] for b in plan] == [["t0", "t1", "t2"], ["t3", "t4"], ["t5"], ["t6"], ["t7"]]
    assert all(sum(e.nbytes for e in b) <= 400 or len(b) == 1 for b in plan)
    assert len(plan_buckets(entries, 1 << 30)) == 1
    with pytest.raises(ValueError):
        plan_buckets(entries, 0)


def _tp2_rank(rank: int, port: int, url: str, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    from gyre_hpc.config import TrainConfig
    from gyre_hpc.engines.client import EngineClient
    from gyre_hpc.engines.weight_sync import WeightPusher
    from gyre_hpc.engines.weights import weights_checksum
    from gyre_hpc.train.model import forward_logits, init_parallel
    from gyre_hpc.train.step import Trainer

    init_parallel(world_size=2, rank=rank, tensor_parallel=2, master_port=port)
    trainer = Trainer(ModelConfig(**MODEL), TrainConfig(lr=1e-2, weight_bucket_mb=BUCKET / 2**20), seed=0)
    trainer.step(fork_pair(GROUPS, seed=1)[0])  # weights the engine (seed 0) does not hold
    full = trainer.export_weights()
    client = EngineClient(url, timeout=120.0) if rank == 0 else None
    before = client.weights_checksum() if rank == 0 else None
    pusher = WeightPusher(client) if rank == 0 else None
    stats = trainer.push_weights(pusher)
    tokens = [None]
    if rank == 0:
        res = client.generate(PROMPT, {"max_new_tokens": 8, "temperature": 0.0})
        tokens = [(list(res.output_ids), list(res.logprobs), client.weights_checksum(), client.weight_version())]
    dist.broadcast_object_list(tokens, src=0)
    out_ids = tokens[0][0]
    seq = PROMPT + out_ids
    s = len(seq)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1).view(1, 1, s, s)
    with torch.no_grad():
        logits = forward_logits(trainer.model, torch.tensor([seq]), torch.arange(s)[None], mask)[0]
    logp = torch.log_softmax(logits.double(), -1)
    mine = [float(logp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(out_ids)]
    greedy = [int(logp[len(PROMPT) - 1 + i].argmax()) for i in range(len(out_ids))]
    every = [None, None]
    dist.all_gather_object(every, {k: stats[k] for k in ("buckets", "max_bucket_bytes")})
    from gyre_hpc.config import TransferConfig
    from gyre_hpc.transfer import make_publisher, make_puller

    transfer = TransferConfig(backend="inprocess")
    publisher = make_publisher(transfer) if rank == 0 else None
    desc = trainer.publish_weights(publisher)  # the Mooncake road, same buckets, megatron names
    if rank == 0:
        with make_puller(transfer) as puller:
            pulled = puller.pull(desc)[0]
            published = list(pulled) == list(full) and all(np.array_equal(pulled[k], full[k].numpy()) for k in full)
        publisher.close()
        pusher.close()
        queue.put({"published": published, "engine": tokens[0], "mine": mine, "greedy": greedy, "ranks": every, "push": stats,
                   "checksum": weights_checksum(full), "before": before,
                   "model_bytes": sum(v.numel() * v.element_size() for v in full.values())})
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.engine
def test_tp2_trainer_streams_sub_layer_buckets_into_a_real_engine_whose_logprobs_then_match(
        spawn_ranks, local_engine):
    from gyre_hpc.config import EngineConfig
    from gyre_hpc.train.model import _free_port

    engine = local_engine(EngineConfig(max_running_requests=4, context_len=256, startup_timeout_s=300.0,
                                       request_timeout_s=300.0), ModelConfig(**MODEL), seed=0)
    port = _free_port()
    got, codes = spawn_ranks(_tp2_rank, [(r, port, engine.url) for r in range(2)], timeout=600)
    assert codes == [0, 0]
    (out_ids, engine_logp, checksum, version), push = got["engine"], got["push"]
    assert got["published"]  # the bucketed publish pulls back exactly the gathered weights
    assert got["before"] != got["checksum"] == checksum and version == "1"  # the engine holds the trainer's weights
    assert out_ids == got["greedy"]
    assert np.max(np.abs(np.array(engine_logp) - np.array(got["mine"]))) < 1e-4  # float rounding (fp32 forward)
    # sub-layer buckets: several per layer; no rank materialised more than one bucket of full tensors
    assert push["buckets"] >= 2 * ModelConfig().layers + 2 and push["attempt"] == 0
    assert all(r["buckets"] == push["buckets"] for r in got["ranks"])
    assert 0 < got["ranks"][0]["max_bucket_bytes"] <= BUCKET
    assert got["ranks"][1]["max_bucket_bytes"] == 0  # TP rank 1 only contributes its shards
    assert push["max_bucket_bytes"] <= BUCKET < got["model_bytes"] / 4


def _pp2_rank(rank: int, port: int, full: dict, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    from gyre_hpc.train.reshard import ReshardStats, iter_buckets
    from gyre_hpc.train.stages import init_layout, load_stage, stage_model

    cfg = ModelConfig(layers=4, **MODEL)
    init_layout(2, rank, tp=1, pp=2, port=port)
    model = stage_model(cfg, seed=rank + 7)  # each stage starts elsewhere; the full weights are loaded into it
    load_stage(model, {k: torch.from_numpy(v) for k, v in full.items()}, cfg.swiglu)
    stats, got, sizes = ReshardStats(), {}, []
    for tensors, last in iter_buckets(model, cfg, BUCKET, stats):
        got.update({k: v.numpy() for k, v in tensors.items()})
        sizes.append((sum(v.numel() * v.element_size() for v in tensors.values()), last))
    every = [None, None]
    dist.all_gather_object(every, stats.max_bucket_bytes)
    from gyre_hpc.config import TransferConfig
    from gyre_hpc.transfer import make_publisher, make_puller
    from gyre_hpc.train.reshard import publish_resharded

    transfer = TransferConfig(backend="inprocess")
    publisher = make_publisher(transfer) if rank == 0 else None
    desc, _ = publish_resharded(model, cfg, publisher, 1, BUCKET)  # the satellites' road: megatron names
    if rank == 0:
        with make_puller(transfer) as puller:
            pulled = {k: v.copy() for k, v in puller.pull(desc)[0].items()}
        publisher.close()
        queue.put({"hf": got, "sizes": sizes, "max": every, "buckets": stats.buckets, "pulled": pulled})
    dist.barrier()
    dist.destroy_process_group()


def test_pp2_buckets_and_the_published_buffer_equal_the_single_rank_export_bit_for_bit(spawn_ranks):
    from gyre_hpc.train.checkpoint import gather_full
    from gyre_hpc.train.hf_weights import to_hf
    from gyre_hpc.train.model import _free_port, build_model

    cfg = ModelConfig(layers=4, **MODEL)
    full = gather_full(build_model(cfg, seed=3), cfg.swiglu)
    want = {k: v.numpy() for k, v in to_hf(full, cfg).items()}
    port, arrays = _free_port(), {k: v.numpy() for k, v in full.items()}
    got, codes = spawn_ranks(_pp2_rank, [(r, port, arrays) for r in range(2)], timeout=600)
    assert codes == [0, 0]
    assert list(got["hf"]) == list(want) and all(np.array_equal(got["hf"][k], want[k]) for k in want)
    assert [last for _, last in got["sizes"]] == [False] * (got["buckets"] - 1) + [True]
    assert got["buckets"] >= 2 * cfg.layers and all(0 < m <= BUCKET for m in got["max"])
    assert list(got["pulled"]) == list(full) and all(np.array_equal(got["pulled"][k], full[k].numpy()) for k in full)

