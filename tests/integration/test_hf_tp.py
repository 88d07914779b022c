"""An HF checkpoint loads sharded for TP=2 (two processes over gloo): same logits as transformers, and the TP=2
training checkpoint exports back to the source tensors bit for bit (shards merged per query group, [gate; up])."""
import pytest
import torch

pytestmark = [pytest.mark.megatron, pytest.mark.slow]


def rank_main(rank: int, port: int, hf_path: str, run_dir: str, queue) -> None:
    torch.set_num_threads(1)
    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.models.check import megatron_logits
    from gyre_hpc.train.model import init_parallel
    from gyre_hpc.train.step import Trainer

    init_parallel(world_size=2, rank=rank, tensor_parallel=2, master_port=port)
    trainer = Trainer(ModelConfig(hf_path=hf_path), TrainConfig(), seed=rank)  # the seed must not matter
    ids = torch.arange(12).reshape(2, 6) * 37 % 1024
    pos = torch.tensor([[0, 1, 2, 3, 2, 3], [0, 1, 2, 1, 2, 3]])
    logits = megatron_logits(trainer.model, ids, pos)
    trainer.save_checkpoint(f"{run_dir}/checkpoints/latest")
    if rank == 0:
        queue.put((ids.numpy(), pos.numpy(), logits.numpy()))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def test_tp2_load_matches_transformers_and_exports_the_source_tensors(tmp_path, run_dir, spawn_ranks):
    import yaml

    from gyre_hpc.config import GyreConfig, ModelConfig, to_dict
    from gyre_hpc.models.check import hf_logits
    from gyre_hpc.models.export import export
    from gyre_hpc.train.hf_io import read_safetensors
    from gyre_hpc.models.init import init_model
    from gyre_hpc.train.model import _free_port

    # kv_heads 2 over TP 2: each rank holds one whole query group of 3 query heads
    hf = init_model("qwen3", tmp_path / "hf", hidden=96, heads=6, kv_heads=2, head_dim=32, context=64, seed=4)
    run = run_dir
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(GyreConfig(model=ModelConfig(hf_path=str(hf))))))
    port = _free_port()
    (ids, pos, logits), codes = spawn_ranks(rank_main, [(r, port, str(hf), str(run)) for r in range(2)], timeout=300)
    assert codes == [0, 0]
    want = hf_logits(hf, torch.from_numpy(ids), torch.from_numpy(pos))
    assert float((torch.from_numpy(logits) - want).abs().max()) <= 1e-4
    source, exported = read_safetensors(hf), read_safetensors(export(run, tmp_path / "out"))
    assert set(source) == set(exported) and all(torch.equal(source[k], exported[k]) for k in source)
