"""Trainer layouts of TP x PP ranks built by hand, for the resharding tests and benchmark
(``gyre_hpc.train.reshard``) until ``train.model`` builds pipeline stages itself (issue 27, section 2).

Invariant: ``load_stage`` gives each rank exactly its stage's layers and its TP slice of the full megatron tensors
(tests/integration/test_reshard.py: the PP 2 stages export bit-identical to the single-rank model).
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.distributed as dist

from gyre_hpc.config import ModelConfig
from gyre_hpc.train.reshard import local_entries


def init_layout(world: int, rank: int, tp: int, pp: int, port: int, seed: int = 0) -> None:
    """A gloo (CPU) or nccl world of ``world`` ranks with megatron's TP x PP groups (DP = the rest)."""
    import os

    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from gyre_hpc.train import cpu_compat

    cpu_compat.apply()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", world_size=world, rank=rank)
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(seed)


def stage_model(cfg: ModelConfig, seed: int = 0) -> torch.nn.Module:
    """This rank's pipeline stage of the model (its layers; the embedding on the first stage, the final norm and
    output layer on the last): what the tests and the benchmark export until ``train.model.build_model`` builds
    stages itself."""
    import dataclasses

    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from gyre_hpc.train.model import quiet_megatron, transformer_config

    pp = ps.get_pipeline_model_parallel_world_size()
    tc = transformer_config(cfg)
    if pp > 1:
        tc = dataclasses.replace(tc, pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32)
    torch.manual_seed(seed)
    with quiet_megatron():
        model = GPTModel(config=tc, transformer_layer_spec=get_gpt_layer_local_spec(
                             normalization=cfg.normalization, qk_layernorm=cfg.qk_layernorm),
                         vocab_size=cfg.vocab_size, max_sequence_length=cfg.max_seq_len,
                         position_embedding_type=cfg.position_embedding, rotary_base=cfg.rotary_base,
                         share_embeddings_and_output_weights=cfg.tie_embeddings,
                         pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage())
    return model.cuda() if torch.cuda.is_available() else model


def load_stage(model: torch.nn.Module, full: Mapping[str, torch.Tensor], swiglu: bool) -> None:
    """Copy full megatron tensors (global names) into this stage's TP slices."""
    from megatron.core import parallel_state as ps

    from gyre_hpc.train.hf_weights import shard

    tp, rank, stage = (ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
                       ps.get_pipeline_model_parallel_rank())
    params, state = dict(model.named_parameters()), model.state_dict()
    with torch.no_grad():
        for e in local_entries(model, swiglu, stage, tp):
            if e.name in full:
                state[e.local].copy_(shard(e.name, full[e.name], params.get(e.local), tp, rank, swiglu))
