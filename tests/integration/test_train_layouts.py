"""Every layout of a cell's trainer takes the step one worker would: DP 2 and TP 2 x DP 2 (gloo on the CPU), and a
core under TP 2 that sums a one-worker satellite's whole-model gradients (TP 2 alone: test_train_tp.py).

The step is the core cell's (gyre_hpc.live.training_side.CoreTrainer): each group's whole-model gradients
(``group_grads_full``), summed weighted by trained tokens, then one AdamW update (``apply_grads``)."""
import numpy as np
import pytest

from train_batches import fork_pair

pytestmark = [pytest.mark.megatron, pytest.mark.slow, pytest.mark.timeout(1500)]

GROUPS_A = [(2, 5, [3, 4, 2], 1.0), (1, 6, [2, 5], -0.5)]  # two tree rows: DP 2 gives each replica one
GROUPS_B = [(3, 4, [6], 0.7)]
MODEL = dict(heads=4, kv_heads=2)


def core_step(rank: int, world: int, tp: int, meet: str, remote: dict | None, ckpt: str | None, sharded: bool,
              queue) -> None:
    """One core step on this rank of a ``world``-worker cell with TP ``tp``: group A here (and group B here too,
    or ``remote``: group B's (z, loss, whole-model gradients) from a satellite); then a checkpoint into ``ckpt``.
    ``sharded``: the AdamW moments sharded over the data-parallel replicas (``train.distributed_optimizer``)."""
    import torch

    torch.set_num_threads(1)
    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train.model import init_parallel
    from gyre_hpc.train.step import Trainer

    if world > 1:  # a file store: no port to race other processes for
        import torch.distributed as dist

        init_parallel(world_size=world, rank=rank, tensor_parallel=tp, store=dist.FileStore(meet, world))
    else:
        init_parallel()
    trainer = Trainer(ModelConfig(**MODEL), TrainConfig(lr=1e-2, micro_batch_tokens=8, distributed_optimizer=sharded),
                      seed=0)
    groups = [fork_pair(GROUPS_A, seed=1)[0]] + ([] if remote else [fork_pair(GROUPS_B, seed=2)[0]])
    acc, z_sum, losses = {}, 0.0, []
    for batch in groups:
        metrics, grads, _ = trainer.group_grads_full(batch)
        z = float(batch.loss_mask.sum())
        losses.append(metrics["loss"])
        for k, g in grads.items():
            acc[k] = acc.get(k, 0) + z * g.numpy()
        z_sum += z
    if remote:
        for k, g in remote["grads"].items():
            acc[k] = acc[k] + remote["z"] * g
        z_sum += remote["z"]
        losses.append(remote["loss"])
    satellite = None
    if world == 1 and not remote:  # what a one-worker satellite sends for group B (on the same initial weights)
        batch = groups[1]
        metrics, grads, _ = trainer.group_grads_full(batch)
        satellite = {"z": float(batch.loss_mask.sum()), "loss": metrics["loss"],
                     "grads": {k: v.numpy() for k, v in grads.items()}}
    norm = trainer.apply_grads({k: v / z_sum for k, v in acc.items()})
    after = {k: v.numpy() for k, v in trainer.export_weights().items()}
    if ckpt:
        trainer.save_checkpoint(ckpt)
    if rank == 0:
        queue.put({"losses": losses, "norm": norm, "after": after, "shapes": trainer.full_shapes(),
                   "satellite": satellite, "moments": moments(trainer) if world == 1 else None,
                   "held": trainer.sharded.held() if trainer.sharded else None})
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def moments(trainer) -> dict:
    """The optimizer's first and second moments by parameter name (a one-worker trainer: whole tensors)."""
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    return {f"{names[i]}/{k}": v.numpy().copy() for i, st in trainer.optimizer.state_dict()["state"].items()
            for k, v in st.items() if k != "step"}


def resume_alone(ckpt: str, queue) -> None:
    """A one-worker trainer resuming from ``ckpt``, whatever layout wrote it."""
    import torch

    torch.set_num_threads(1)
    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train.model import init_parallel
    from gyre_hpc.train.step import Trainer

    init_parallel()
    trainer = Trainer(ModelConfig(**MODEL), TrainConfig(lr=1e-2, micro_batch_tokens=8), seed=5)  # other weights
    trainer.load_checkpoint(ckpt)
    queue.put({"after": {k: v.numpy() for k, v in trainer.export_weights().items()}, "moments": moments(trainer),
               "version": trainer.version})


@pytest.fixture(scope="module")
def reference():
    """The step of one worker (TP 1), computed once for the module in a spawned process."""
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=core_step, args=(0, 1, 1, "", None, None, False, queue))
    proc.start()
    try:
        got = queue.get(timeout=600)
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    return got


def assert_same_step(got: dict, ref: dict) -> None:
    assert got["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    assert got["norm"] == pytest.approx(ref["norm"], rel=1e-5)
    assert set(got["after"]) == set(ref["after"])
    for k, v in ref["after"].items():  # AdamW's first update is ~lr x sign(g): compare to 1% of a step of 1e-2
        assert got["after"][k].shape == v.shape
        assert float(np.abs(got["after"][k] - v).max()) < 1e-4, k


@pytest.mark.parametrize("world, tp, sharded", [(2, 1, False), (4, 2, False), (4, 2, True)],
                         ids=["dp2", "tp2xdp2", "tp2xdp2-distributed-optimizer"])
def test_a_cell_of_workers_takes_the_step_of_one_worker_and_its_checkpoint_resumes_on_one(
        spawn_ranks, reference, world, tp, sharded, tmp_path):
    meet, ckpt = str(tmp_path / "store"), str(tmp_path / "ckpt")
    got, codes = spawn_ranks(core_step, [(r, world, tp, meet, None, ckpt, sharded) for r in range(world)],
                             timeout=600)
    assert codes == [0] * world
    if sharded:  # rank 0 (replica 0) holds the moments of about half its shards' elements, not all of them
        mine, total = got["held"]
        assert 0.3 * total < mine < 0.7 * total, got["held"]
    assert got["shapes"] == reference["shapes"]  # whole-model shapes, whatever the layout
    assert_same_step(got, reference)
    resumed, codes = spawn_ranks(resume_alone, [(ckpt,)], timeout=600)  # another layout: one worker
    assert codes == [0]
    assert all(np.array_equal(resumed["after"][k], v) for k, v in got["after"].items())  # bit for bit
    assert set(resumed["moments"]) == set(reference["moments"])
    for k, v in reference["moments"].items():  # the optimizer's moments re-cut, equal to one worker's
        assert np.allclose(resumed["moments"][k], v, rtol=1e-4, atol=1e-9), k


def test_a_core_under_tp2_sums_a_one_worker_satellites_gradients_exactly(spawn_ranks, reference, tmp_path):
    meet = str(tmp_path / "store")
    got, codes = spawn_ranks(core_step, [(r, 2, 2, meet, reference["satellite"], None, False) for r in range(2)],
                             timeout=600)
    assert codes == [0, 0]
    assert_same_step(got, reference)
