"""Qwen3-MoE: transformers against megatron (the model check), and expert parallel 2 against 1 over gloo."""
import numpy as np
import pytest
import torch

from train_batches import fork_pair

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

GROUPS = [(2, 5, [3, 4, 2], 1.0), (1, 6, [2, 5], -0.5), (3, 4, [6], 0.7)]
#: 4 experts, top-2 renormalised, expert MLPs of 32: every layer MoE
TINY = dict(hidden=64, layers=2, heads=4, kv_heads=2, vocab=300, context=256, experts=4, topk=2, moe_ffn=32)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from gyre_hpc.models.init import init_model

    return init_model("qwen3_moe", tmp_path_factory.mktemp("moe") / "tiny-moe", seed=1, **TINY)


def test_model_check_shows_the_same_logits_and_a_bit_identical_round_trip(moe_dir):
    from gyre_hpc.models.check import check_model

    report = check_model(moe_dir, seq=24)
    assert report["arch"] == "Qwen3MoeForCausalLM"
    assert report["max_abs_logit_diff"] < 1e-4  # observed ~2e-7
    assert report["roundtrip_identical"] is True


def test_a_wrong_expert_order_is_caught(moe_dir, monkeypatch):
    """Negative control: swapping two experts' weights in the mapping changes the logits by far more than 1e-4."""
    from gyre_hpc.config import ModelConfig
    from gyre_hpc.models.check import hf_logits, megatron_logits, sample_ids
    from gyre_hpc.train import hf_weights
    from gyre_hpc.train.model import build_model

    real = hf_weights.to_megatron

    def swapped(hf, cfg):
        out = real(hf, cfg)
        a, b = (f"decoder.layers.0.mlp.experts.local_experts.{e}.linear_fc1.weight" for e in (0, 1))
        out[a], out[b] = out[b], out[a]
        return out

    monkeypatch.setattr(hf_weights, "to_megatron", swapped)
    cfg = ModelConfig(hf_path=str(moe_dir))
    ids, pos = sample_ids(cfg, 2, 24, 0)
    diff = (megatron_logits(build_model(cfg).eval(), ids, pos) - hf_logits(moe_dir, ids, pos)).abs().max().item()
    assert diff > 1e-3


def ep_trainer(rank_world: tuple[int, int], port: int, path: str):
    """A trainer of the MoE model at ``path`` on this rank of an expert-parallel world of ``world`` ranks."""
    rank, world = rank_world
    torch.set_num_threads(1)
    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train.model import init_parallel
    from gyre_hpc.train.step import Trainer

    if world > 1:
        init_parallel(world_size=world, rank=rank, expert_parallel=world, master_port=port)
    trainer = Trainer(ModelConfig(hf_path=path), TrainConfig(lr=1e-2, expert_parallel=world), seed=0)
    return trainer


def run_one_step(rank_world: tuple[int, int], port: int, path: str, queue) -> None:
    rank, world = rank_world
    trainer = ep_trainer(rank_world, port, path)
    held = sum(1 for n, _ in trainer.model.named_parameters() if "local_experts" in n)
    tree, _ = fork_pair(GROUPS, seed=1, vocab=300)
    initial = trainer.export_weights()
    metrics = trainer.step(tree)
    after = trainer.export_weights()
    if rank == 0:  # numpy copies: tensors would travel as shared memory that dies with this process
        queue.put(({k: v.numpy() for k, v in initial.items()}, metrics, {k: v.numpy() for k, v in after.items()},
                   held))
    if world > 1:  # leave gloo in order
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def test_expert_parallel_2_matches_1_in_loss_grad_norm_and_update(moe_dir, spawn_ranks):
    import torch.multiprocessing as mp

    from gyre_hpc.train.model import _free_port

    queue = mp.get_context("spawn").Queue()
    run_one_step((0, 1), 0, str(moe_dir), queue)
    init1, m1, after1, held1 = queue.get(timeout=60)
    port = _free_port()
    (init2, m2, after2, held2), codes = spawn_ranks(
        run_one_step, [((r, 2), port, str(moe_dir)) for r in range(2)], timeout=300)
    assert codes == [0, 0]
    assert held2 * 2 == held1  # each EP rank holds half of the experts' parameters
    assert set(init1) == set(init2)  # export gathers every expert under its global index
    assert all(np.array_equal(init1[k], init2[k]) for k in init1)
    assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5)
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    for k in after1:  # updated parameters within 1e-5 relative (of the tensor's scale)
        scale = max(float(np.abs(after1[k]).max()), 1e-12)
        assert float(np.abs(after1[k] - after2[k]).max()) <= 1e-5 * scale + 1e-7, k
    moved = [k for k in after1 if "local_experts" in k and not np.array_equal(after1[k], init1[k])]
    assert moved  # the step trained experts


def run_cell_step(rank_world: tuple[int, int], port: int, path: str, queue) -> None:
    """The core cell's step (live/training_side.CoreTrainer) on an expert-parallel cell: whole-model gradients out
    (``group_grads_full``), one update from them (``apply_grads``), whole-model weights back in (``load_weights``)."""
    rank, world = rank_world
    trainer = ep_trainer(rank_world, port, path)
    tree, _ = fork_pair(GROUPS, seed=1, vocab=300)
    initial = trainer.export_weights()
    _, grads, _ = trainer.group_grads_full(tree)
    shapes = trainer.full_shapes()
    trainer.apply_grads({k: v.numpy() for k, v in grads.items()})
    after = trainer.export_weights()
    trainer.load_weights(initial)  # whole-model tensors into this rank's experts
    back = trainer.export_weights()
    if rank == 0:
        queue.put(({k: v.numpy() for k, v in grads.items()}, shapes, {k: v.numpy() for k, v in after.items()},
                   all(np.array_equal(back[k].numpy(), initial[k].numpy()) for k in initial)))
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def test_an_expert_parallel_cell_exchanges_whole_model_gradients_and_weights_as_one_worker_does(moe_dir, spawn_ranks):
    import torch.multiprocessing as mp

    from gyre_hpc.train.model import _free_port

    queue = mp.get_context("spawn").Queue()
    run_cell_step((0, 1), 0, str(moe_dir), queue)
    grads1, shapes1, after1, _ = queue.get(timeout=60)
    port = _free_port()
    (grads2, shapes2, after2, round_trip), codes = spawn_ranks(
        run_cell_step, [((r, 2), port, str(moe_dir)) for r in range(2)], timeout=300)
    assert codes == [0, 0]
    assert shapes2 == shapes1 and set(grads2) == set(grads1)  # every expert under its global index
    assert set(grads1) == {k for k in shapes1}
    for k in grads1:
        scale = max(float(np.abs(grads1[k]).max()), 1e-12)
        assert float(np.abs(grads1[k] - grads2[k]).max()) <= 1e-5 * scale + 1e-9, k
    for k in after1:
        scale = max(float(np.abs(after1[k]).max()), 1e-12)
        assert float(np.abs(after1[k] - after2[k]).max()) <= 1e-5 * scale + 1e-7, k
    assert round_trip
