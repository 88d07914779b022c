"""Configuration: frozen dataclasses per component, loaded from YAML with strict errors.

Invariants
- Every field of every section has a type and a one-line doc (``param(default, doc)``); ``gyre config explain``
  prints them.
- Loading never guesses: an unknown key, a wrong type, or a value outside its choices raises ``ConfigError``
  naming the dotted key (``trajectory.j_max``) and, for unknown keys, the valid ones.
- ``--set a.b=c`` overrides are parsed as YAML scalars (``null``, ``1.5``, ``true``) and then pass through the
  same loader, so an override is exactly as typed and checked as the file.
- Config flows down: each component receives its own frozen section, never the root.

Supported field types: bool, int, float (an int is accepted), str, ``Literal[...]``, ``X | None``,
``tuple[X, ...]`` and nested dataclasses (also inside tuples).
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from gyre_hpc.launcher import listen
from gyre_hpc.errors import ConfigError, FieldError, require


def param(default: Any, doc: str, **kwargs: Any) -> Any:
    """A documented dataclass field; mutable defaults (dataclasses, tuples) are handled."""
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return field(default_factory=lambda: default, metadata={"doc": doc}, **kwargs)
    return field(default=default, metadata={"doc": doc}, **kwargs)


# --------------------------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class RunConfig:
    """Where a job writes and how it is seeded."""

    name: str = param("gyre", "Run name; the run directory is <out_dir>/<name>-<timestamp>.")
    out_dir: str = param("runs", "Directory under which run directories are created.")
    seed: int = param(0, "Seed for every random choice of the job (workload, sampling, init).")
    max_relaunches: int = param(
        2, "`gyre train` relaunches its run with --resume at most this many times after it lost a rank (exit 69) or "
        "a cell's rank failed (70) with the resume state saved; never after a preemption; 0 = exit instead.")
    resume_every_steps: int = param(
        1, "Rank 0 writes RUN_DIR/resume after every this many steps it applied (event resume_saved), so a run "
        "whose rank 0 dies (SIGKILL, OOM) is relaunched from it; 0 = never (only preemptions and lost ranks save).")

    def check(self) -> None:
        require(0 <= self.max_relaunches <= 100, "max_relaunches", f"must be in 0..100, got {self.max_relaunches}")
        require(self.resume_every_steps >= 0, "resume_every_steps", f"must be >= 0, got {self.resume_every_steps}")


@dataclass(frozen=True)
class TrajectoryConfig:
    """How TITO logs become training samples (prefix tree, J_max, scoring, advantages, packing)."""

    j_max: int | None = param(5, "At most this many paths per run enter training; null = unlimited.")
    selection: Literal["final_then_recent", "final_then_longest", "longest"] = param(
        "final_then_recent",
        "Which paths J_max keeps: the final-answer path, then the most recent (or most-generated) others; "
        "'longest' ranks all paths by generated tokens only.",
    )
    equal_score_groups: Literal["drop", "keep"] = param(
        "drop", "Groups whose scorable runs all have the same score: drop them, or keep them with advantage 0."
    )
    advantage_norm: Literal["mean", "mean_std"] = param(
        "mean_std", "Advantage = score - group mean ('mean'), or that divided by (group std + advantage_eps)."
    )
    advantage_eps: float = param(1e-6, "Added to the group standard deviation before dividing (mean_std).")
    pack_mode: Literal["tree", "flat"] = param(
        "tree", "tree: each run's paths share their prefixes in one row; flat: one path per row."
    )
    max_row_tokens: int = param(1024, "Tokens per packed row; a run tree (or flat path) longer than this is an error.")
    vocab_size: int | None = param(
        None, "Reject token ids >= this when reading TITO logs; null = only negative ids are rejected."
    )

    def check(self) -> None:
        require(self.j_max is None or self.j_max >= 1, "j_max", f"must be >= 1 or null, got {self.j_max}")
        require(self.advantage_eps > 0, "advantage_eps", f"must be > 0, got {self.advantage_eps}")
        require(self.max_row_tokens >= 2, "max_row_tokens", f"must be >= 2, got {self.max_row_tokens}")
        require(self.vocab_size is None or self.vocab_size >= 1, "vocab_size",
                f"must be >= 1 or null, got {self.vocab_size}")


#: upper bounds of the cluster geometry (far above any allocation this suite plans for; a typo such as
#: cells=100000 fails at load instead of building a layout for hours)
GEOMETRY_LIMITS = {"cells": 4096, "nodes_per_cell": 4096, "gpus_per_node": 64, "tensor_parallel": 1024,
                   "pipeline_parallel": 1024}
MAX_NODES = 65536


@dataclass(frozen=True)
class ClusterConfig:
    """The cells of one allocation (one SLURM job, or one machine in the embedded default)."""

    cells: int = param(4, "Number of cells (node groups) that serve rollouts or host a training replica.")
    nodes_per_cell: int = param(1, "Nodes in each cell; every cell has the same size.")
    gpus_per_node: int = param(0, "GPUs per node; 0 means CPU-only cells (the embedded default).")
    tensor_parallel: int = param(1, "Tensor-parallel size of one training replica / engine inside a cell.")
    pipeline_parallel: int = param(1, "Pipeline-parallel size of one training replica inside a cell.")
    workers_per_node: int | None = param(
        None, "Worker processes per node, one per GPU: a cell runs nodes_per_cell x workers_per_node workers "
              "that train together (TP x PP x DP) or serve together (engine replicas). null = gpus_per_node, or 1 "
              "on CPU-only cells; on CPU a larger value emulates GPUs (each worker a process); with GPUs it must "
              "equal gpus_per_node.")
    listen_interface: str | None = param(
        None, "Interface whose address the run's wildcard listeners bind (mpirun, Open MPI's TCP BTL, Mooncake's "
        "handshake: an LD_PRELOAD shim, gyre_hpc/native/bind_local.c; each process reads its own node's address); "
        "null = lo where the whole job runs on one machine (gyre train, slurm.local_cluster), off on a real "
        "cluster; \"\" = off; a name (ib0, eth0) = that interface on every node (docs/reliability.md).")

    def check(self) -> None:
        if self.listen_interface is not None:
            problem = listen.name_error(self.listen_interface)
            require(problem is None, "listen_interface", problem or "")
        for key in ("cells", "nodes_per_cell", "tensor_parallel", "pipeline_parallel"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.gpus_per_node >= 0, "gpus_per_node", f"must be >= 0, got {self.gpus_per_node}")
        if self.workers_per_node is not None:
            require(1 <= self.workers_per_node <= GEOMETRY_LIMITS["gpus_per_node"], "workers_per_node",
                    f"must be between 1 and {GEOMETRY_LIMITS['gpus_per_node']}, got {self.workers_per_node}")
            require(not self.gpus_per_node or self.workers_per_node == self.gpus_per_node, "workers_per_node",
                    f"is one worker per GPU: with gpus_per_node={self.gpus_per_node} it must be "
                    f"{self.gpus_per_node} or null, got {self.workers_per_node}")
        for key, most in GEOMETRY_LIMITS.items():  # absurd geometry is refused here, before any plan is made
            require(getattr(self, key) <= most, key, f"must be <= {most}, got {getattr(self, key)}")
        require(self.cells * self.nodes_per_cell <= MAX_NODES, "cells",
                f"cells x nodes_per_cell must be <= {MAX_NODES} nodes, got {self.cells * self.nodes_per_cell}")

    @property
    def workers(self) -> int:
        """Worker processes per node (one per GPU; emulated GPUs on CPU-only cells)."""
        return self.workers_per_node or self.gpus_per_node or 1

    @property
    def workers_per_cell(self) -> int:
        return self.nodes_per_cell * self.workers


@dataclass(frozen=True)
class ModelConfig:
    """The policy model: a megatron-core ``GPTModel`` (local layer spec), sized for the CPU by default.

    With ``hf_path`` set, every architecture field is the one its config.json describes
    (``gyre_hpc.files.hf_config``); a field given another non-default value is an error, and the weights come
    from its safetensors."""

    hf_path: str | None = param(
        None,
        "A Hugging Face model directory (Qwen2ForCausalLM / Qwen3ForCausalLM: config.json, *.safetensors, "
        "tokenizer files). Its config.json sets the architecture fields below and the trainer and engines load its "
        "weights; null = the randomly initialised model the fields below describe: with qk_layernorm true "
        "(Qwen3-format, configs/local.yaml) `gyre train` writes it once as RUN_DIR/model/init and points hf_path "
        "there (docs/models.md). `gyre model init` makes one.",
    )

    vocab_size: int = param(256, "Vocabulary size (token ids must be below it).")
    hidden: int = param(64, "Hidden size of the transformer.")
    layers: int = param(2, "Number of transformer layers.")
    heads: int = param(4, "Attention heads; must divide hidden.")
    kv_heads: int | None = param(None, "Key/value head groups (grouped-query attention); null = heads.")
    ffn: int = param(256, "Hidden size of the MLP (per projection when swiglu).")
    max_seq_len: int = param(512, "Longest position id + 1 the model accepts (learned table / RoPE range).")
    position_embedding: Literal["mrope", "learned_absolute"] = param(
        "mrope",
        "How positions enter: mrope with three identical rows equals RoPE and honours tree position ids; "
        "learned_absolute is a learned table. (Plain rope ignores position ids and is not offered.)",
    )
    rotary_base: int = param(10000, "RoPE base period (mrope only).")
    normalization: Literal["RMSNorm", "LayerNorm"] = param("RMSNorm", "Normalization layer type.")
    swiglu: bool = param(True, "Gated SiLU MLP (linear_fc1 holds [gate; up]); false = GELU MLP.")
    tie_embeddings: bool = param(False, "Share the input embedding and the output layer weights.")
    attention: Literal["local", "sdpa", "tree"] = param(
        "tree",
        "Core attention inside megatron's local layer spec: local = megatron's DotProductAttention (unfused); "
        "sdpa = torch scaled_dot_product_attention (fused kernel, same function, same tree masks); "
        "tree = tree attention from the O(T) span_end vector, no [T, T] mask or score tensor (blockwise "
        "online-softmax kernel on CPU, FlexAttention on CUDA; docs/training.md): memory linear in tokens.",
    )
    head_dim: int | None = param(None, "Channels per attention head (megatron kv_channels); null = hidden / heads.")
    qk_layernorm: bool = param(False, "RMSNorm over each head's queries and keys (Qwen3); with hf_path null it makes "
                                      "the model Qwen3-format: its initial weights become a Qwen3 directory of the run")
    qkv_bias: bool = param(False, "Biases on the query/key/value projection (Qwen2).")
    norm_eps: float = param(1e-5, "Epsilon of every normalization layer (Qwen: 1e-6).")
    experts: int = param(0, "Mixture of experts (Qwen3-MoE, gyre_hpc/train/moe.py): routed experts in every layer's "
                            "MLP; 0 = a dense MLP (ffn).")
    experts_topk: int = param(2, "Experts each token is routed to (HF num_experts_per_tok); MoE only.")
    moe_ffn: int = param(64, "Hidden size of each expert's SwiGLU MLP (HF moe_intermediate_size); MoE only.")
    norm_topk: bool = param(True, "Renormalise the top-k router probabilities to sum to 1 (HF norm_topk_prob); "
                                  "false = the softmax over all experts, taken at the top k. MoE only.")

    def __post_init__(self) -> None:
        if self.hf_path is not None:
            from gyre_hpc.files.hf_config import resolve_fields

            for key, value in resolve_fields(self).items():
                object.__setattr__(self, key, value)

    def check(self) -> None:
        for key in ("vocab_size", "hidden", "layers", "heads", "ffn", "max_seq_len", "rotary_base"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.head_dim is not None or self.hidden % self.heads == 0, "heads",
                f"{self.heads} does not divide hidden={self.hidden}")
        require(self.head_dim is None or self.head_dim >= 1, "head_dim", f"must be >= 1 or null, got {self.head_dim}")
        require(self.norm_eps > 0, "norm_eps", f"must be > 0, got {self.norm_eps}")
        kv = self.heads if self.kv_heads is None else self.kv_heads
        require(kv >= 1 and self.heads % kv == 0, "kv_heads", f"{kv} must be >= 1 and divide heads={self.heads}")
        require(self.experts >= 0, "experts", f"must be >= 0 (0 = dense), got {self.experts}")
        require(self.experts == 0 or 1 <= self.experts_topk <= self.experts, "experts_topk",
                f"must be in [1, experts={self.experts}], got {self.experts_topk}")
        require(self.experts == 0 or (self.moe_ffn >= 1 and self.swiglu), "moe_ffn",
                f"MoE experts are SwiGLU MLPs of moe_ffn >= 1 (got moe_ffn={self.moe_ffn}, swiglu={self.swiglu})")
        head_dim = self.head_dim or self.hidden // self.heads
        require(
            self.position_embedding != "mrope" or head_dim % 2 == 0,
            "position_embedding",
            f"mrope needs an even head dim, got {head_dim}",
        )


@dataclass(frozen=True)
class TrainConfig:
    """The training step: loss, optimizer, and how many updates each step makes over its batch."""

    loss: Literal["pg", "ppo"] = param(
        "pg", "pg: -A*logp; ppo: clipped importance ratio against old_logprob (the generating policy)."
    )
    clip_eps: float = param(0.2, "PPO clip: the ratio is clipped to [1 - clip_eps, 1 + clip_eps] (ppo only).")
    lr: float = param(1e-3, "Adam learning rate.")
    betas: tuple[float, ...] = param((0.9, 0.999), "Adam (beta1, beta2).")
    weight_decay: float = param(0.0, "Decoupled weight decay (AdamW).")
    grad_clip: float | None = param(1.0, "Clip the global gradient norm to this value; null = no clipping.")
    epochs: int = param(
        1, "PPO epochs: AdamW updates per training step over the same batch (each step still publishes one new "
           "policy version); > 1 needs loss: ppo. Steps per burst are scheduler.mu."
    )
    split_trees: bool = param(
        True, "Cut packed rows into one row per tree before the forward (same logits; dense attention costs L^2)."
    )
    micro_batch_tokens: int | None = param(
        None,
        "Padded tokens per forward/backward: rows are grouped by length up to this budget and gradients "
        "accumulate over the step; null = all rows in one forward.",
    )
    threads: int | None = param(None, "torch intra-op threads on the CPU; null = leave torch's default.")
    device_token_s: float = param(
        0.0, "Emulated accelerator (live training): a group's forward/backward lasts at least device_token_s x its "
             "trained tokens; the trainer sleeps the rest, leaving the CPU to others (engine.device_tick_s's "
             "counterpart). For live benchmarks whose training should cost what it would on a device, on a machine "
             "with fewer cores than cells. 0 = off: a group takes what the CPU takes.")
    tis_cap: float | None = param(
        None, "Truncated importance sampling: each token's policy-gradient term is weighted by "
              "min(exp(trainer_logprob_old - engine_logprob), tis_cap), and ppo's ratio is taken against the "
              "trainer's own logprob before the step (docs/training.md); null = off.",
    )
    weight_bucket_mb: float = param(
        512.0, "Weight sync to the engines (docs/weights.md, resharding): the trainer's TP/PP shards are gathered, "
               "converted to the engine's names and sent in buckets of at most this many MB of full tensors (a "
               "larger single tensor goes alone); no rank holds more than one bucket of full tensors at a time.")
    recompute: bool = param(
        False, "Activation recomputation: each transformer layer keeps only its input in the forward and recomputes "
               "its activations in the backward (long contexts: layer activations stop growing with the layer count).")
    logits_chunk_tokens: int | None = param(
        8192, "The output layer and the log-probabilities run over at most this many trained tokens at a time, "
              "recomputed chunk by chunk in the backward: float32 logits of a whole micro-batch never exist at once "
              "(a 32K-token micro-batch of a 150K vocabulary would hold 20 GB). null = one pass over full logits.")
    overlong: Literal["cut", "drop"] = param(
        "cut", "A token deeper than model.max_seq_len - 1 (position id beyond the model's range): cut = the token "
               "and its subtree (the path's tail) are left out of the step; drop = its whole tree (in flat mode its "
               "path) is left out. Counted in the step metrics (overlong_tokens_cut, overlong_trained_tokens_cut); "
               "nothing beyond the limit is ever computed.")
    context_parallel: int = param(
        1, "Context-parallel ranks per path. Limit 1: megatron-core's context parallel needs TransformerEngine "
           "attention on CUDA, which this trainer does not wire; a larger value fails at load.")

    distributed_optimizer: bool = param(
        False, "ZeRO-1: the AdamW moments are sharded over the data-parallel replicas of a training cell (each "
               "keeps about 1/DP of them and broadcasts the parameters it owns after the step; gyre_hpc/train/zero.py)"
               ". The weights stay those of the unsharded optimizer, bit for bit; checkpoints resume under either.")
    expert_parallel: int = param(
        1, "Expert-parallel size of the training world (MoE models): model.experts are split over this many "
           "ranks, each fed the same rows (gyre_hpc/train/moe.py); it must divide model.experts. 1 = every rank "
           "holds all experts.")

    def check(self) -> None:
        require(self.expert_parallel >= 1, "expert_parallel", f"must be >= 1, got {self.expert_parallel}")
        require(not (self.distributed_optimizer and self.expert_parallel > 1), "distributed_optimizer",
                f"true with expert_parallel {self.expert_parallel}: the expert-parallel ranks hold different experts, "
                f"so their moments are not sharded over them; set one of the two")
        require(self.context_parallel == 1, "context_parallel",
                f"{self.context_parallel} > the limit 1: context parallel needs megatron-core's TransformerEngine "
                f"attention on CUDA, not wired in this trainer (long paths: train.recompute, micro_batch_tokens)")
        require(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        require(self.device_token_s >= 0, "device_token_s", f"must be >= 0, got {self.device_token_s}")
        require(self.tis_cap is None or 0 < self.tis_cap < float("inf"), "tis_cap",
                f"must be a finite number > 0 (the cap C of min(ratio, C)) or null, got {self.tis_cap}")
        require(0 < self.clip_eps < 1, "clip_eps", f"must be in (0, 1), got {self.clip_eps}")
        require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "betas",
            f"must be two numbers in [0, 1), got {list(self.betas)}",
        )
        require(self.weight_bucket_mb > 0, "weight_bucket_mb", f"must be > 0, got {self.weight_bucket_mb}")
        require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(self.grad_clip is None or self.grad_clip > 0, "grad_clip", f"must be > 0 or null, got {self.grad_clip}")
        require(self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}")
        require(self.epochs == 1 or self.loss == "ppo", "epochs",
                f"{self.epochs} updates per batch train off-policy after the first: set train.loss: ppo "
                f"(clipped importance ratio) or train.epochs: 1")
        for key in ("micro_batch_tokens", "threads", "logits_chunk_tokens"):
            v = getattr(self, key)
            require(v is None or v >= 1, key, f"must be >= 1 or null, got {v}")


@dataclass(frozen=True)
class HttpConfig:
    """Limits every HTTP listener of a job enforces (gyre_hpc/net/serving.py): slow, huge or hostile requests."""

    header_timeout_s: float = param(10.0, "A connection must send a complete request head within this; else closed.")
    body_timeout_s: float = param(30.0, "A request must send its whole body within this; else 408.")
    keep_alive_s: float = param(5.0, "An idle keep-alive connection is closed after this (uvicorn timeout_keep_alive).")
    max_body_bytes: int = param(16 << 20, "A larger request body is refused with 413 (Content-Length or counted).")
    max_header_bytes: int = param(64 << 10, "Largest request head (uvicorn h11_max_incomplete_event_size).")
    max_json_depth: int = param(64, "Deeper nesting of a JSON body is refused with 400.")
    max_connections: int = param(4096, "Open connections beyond this get 503 (uvicorn limit_concurrency).")
    max_connections_per_client: int = param(1024, "Open connections of one client address beyond this are closed.")

    def check(self) -> None:
        for key in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
        for key in ("max_body_bytes", "max_header_bytes", "max_json_depth", "max_connections",
                    "max_connections_per_client"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")


@dataclass(frozen=True)
class EngineConfig:
    """Rollout engines: every engine speaks SGLang's HTTP protocol; ``local`` is the in-repo CPU engine."""

    kind: Literal["local", "sglang"] = param("local", "Engine behind each rollout URL: the in-repo local engine or SGLang.")
    tp: int = param(1, "Tensor-parallel size of one engine replica (SGLang --tp-size): a rollout cell serves "
                       "workers_per_cell / tp replicas, each on its own tp GPUs of one node.")
    host: str = param("127.0.0.1", "Address the engines listen on.")
    port_base: int = param(30000, "Engine i listens on port_base + i.")
    max_running_requests: int = param(16, "Requests decoded together in one batch; more wait in a FIFO queue.")
    max_waiting_requests: int = param(1024, "Queued requests beyond this are refused with HTTP 503.")
    context_len: int = param(256, "Most tokens (prompt + output) one request may hold; longer prompts are a 400.")
    default_max_new_tokens: int = param(128, "max_new_tokens when a request does not give it (SGLang's default).")
    eos_token_id: int | None = param(None, "End-of-sequence token (ends a request unless ignore_eos); null = none.")
    initial_weight_version: str = param("0", "weight_version before the first update (model_path: its meta.json wins).")
    model_path: str | None = param(None, "Weights directory loaded at start (local: trainer export; sglang: an HF "
                                         "directory); null = the model's (sglang: model.hf_path, RUN_DIR/model/init)")
    torch_threads: int = param(1, "torch intra-op threads of one local engine process.")
    startup_timeout_s: float = param(180.0, "Seconds launch waits for /health before giving up.")
    request_timeout_s: float = param(600.0, "Client read timeout for one engine call, in seconds.")
    connect_retries: int = param(3, "Client retries of a refused or dropped connection (never of an answered call).")
    sglang_args: tuple[str, ...] = param((), "Extra command-line arguments for sglang.launch_server (kind sglang).")
    device: Literal["auto", "cpu", "cuda"] = param(
        "auto", "Device of an SGLang engine (kind sglang): auto = cuda when torch sees a GPU, else cpu (then "
                "SGLANG_USE_CPU_ENGINE=1 and --device cpu; needs `bash scripts/setup.sh --sglang`).")
    max_total_tokens: int | None = param(
        None, "KV-cache tokens of an SGLang engine (--max-total-tokens); null = max_running_requests x context_len "
              "on cpu (SGLang's own choice there takes most of the machine's memory), SGLang's choice on cuda.")
    sglang_sleep_on_idle: bool | None = param(
        None, "SGLang's --sleep-on-idle: an idle scheduler waits on its sockets (a request wakes it at once) instead "
              "of spinning a whole CPU core per server (benchmarks/bench_sglang_idle.py); null = on for device cpu "
              "(those cores run the ranks, agents and other engines), off on cuda (SGLang's default).")
    max_restarts: int = param(3, "Times a rollout cell restarts its engine after the process died on its own; "
                                 "at one more death the cell gives up (CellFailed, the allocator marks it LOST).")
    weight_road: Literal["distributed", "tensor"] = param(
        "distributed", "How a rollout cell pushes a new version into its engine (docs/weights.md): distributed = "
                       "/update_weights_from_distributed (a gloo/nccl broadcast); tensor = /update_weights_from_tensor "
                       "(the tensors in shared-memory files on the cell's host, SGLang's serialization).")
    sleep_in_training: bool = param(
        False, "A cell that switches to training puts its engine to sleep (/release_memory_occupation) instead of "
               "stopping it, and wakes it (/resume_memory_occupation, then the newest weights) when it returns: a "
               "training->rollout switch without an engine start. Real SGLang on a GPU gets --enable-memory-saver for it "
               "(needs the torch_memory_saver package); on cpu SGLang's release/resume are no-ops: the server stays "
               "alive, holding its memory, and the way back is a wake and a weight load, not a cold start.")
    device_tick_s: float = param(
        0.0, "Emulated accelerator (local engine): a decode tick over n running requests lasts at least "
             "device_tick_s x (1 + n / device_half_load) seconds; the engine sleeps the rest, leaving the CPU to "
             "others. For live benchmarks on a machine with fewer cores than engines, where otherwise every engine "
             "shares the same CPU (a cell owns its GPUs on a cluster). 0 = off: a tick lasts what the CPU takes.")
    device_half_load: float = param(
        16.0, "Emulated accelerator: running requests at which per-request decode speed halves (the "
              "simulator's workload.half_load for the same engine).")
    http: HttpConfig = param(HttpConfig(), "HTTP limits of the local engine's listener.")

    kv_cache: bool = param(
        False, "Local engine: decode on a paged KV cache (prefix cache of hashed full blocks, LRU eviction) instead "
               "of recomputing every sequence each tick. Same greedy tokens either way.")
    kv_block_size: int = param(16, "Local engine, kv_cache: tokens per KV block (the prefix cache's unit).")
    kv_pool_tokens: int = param(
        65536, "Local engine, kv_cache: tokens the KV pool holds (rounded up to whole blocks). A request is "
               "admitted with blocks for prompt + max_new_tokens; when the pool is short it waits, and one that "
               "could never fit is refused with 503.")
    kv_prefill_chunk: int = param(1024, "Local engine, kv_cache: most prompt tokens of one request per forward "
                                        "(long prompts prefill in chunks: attention memory chunk x context).")

    def check(self) -> None:
        for key in ("max_running_requests", "max_waiting_requests", "context_len", "default_max_new_tokens",
                    "torch_threads"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(1 <= self.port_base <= 65535, "port_base", f"must be a TCP port, got {self.port_base}")
        require(self.tp >= 1, "tp", f"must be >= 1, got {self.tp}")
        for key in ("kv_block_size", "kv_pool_tokens", "kv_prefill_chunk"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.connect_retries >= 0, "connect_retries", f"must be >= 0, got {self.connect_retries}")
        require(self.max_restarts >= 0, "max_restarts", f"must be >= 0, got {self.max_restarts}")
        require(self.device_tick_s >= 0, "device_tick_s", f"must be >= 0, got {self.device_tick_s}")
        require(self.device_half_load > 0, "device_half_load", f"must be > 0, got {self.device_half_load}")
        for key in ("startup_timeout_s", "request_timeout_s"):
            require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
        require(self.initial_weight_version != "", "initial_weight_version", "must not be empty")
        require(self.eos_token_id is None or self.eos_token_id >= 0, "eos_token_id", f"must be >= 0, got {self.eos_token_id}")
        require(self.max_total_tokens is None or self.max_total_tokens >= 1, "max_total_tokens",
                f"must be >= 1, got {self.max_total_tokens}")


@dataclass(frozen=True)
class TransferConfig:
    """How satellites and engines pull the core cell's weights (Mooncake Transfer Engine, or stand-ins)."""

    backend: Literal["mooncake", "inprocess", "socket"] = param(
        "mooncake", "Transport: Mooncake Transfer Engine, an in-process memcpy stand-in, or a plain TCP socket."
    )
    protocol: Literal["tcp", "rdma"] = param(
        "tcp", "Mooncake protocol; rdma fails fast when Mooncake finds no RDMA device (no silent TCP fallback)."
    )
    host: str = param("127.0.0.1", "Address this process's transfer endpoint binds and advertises to peers.")
    chunk_bytes: int = param(16 << 20, "Bytes per read request; failures name the chunks of the failed batch.")
    batch_bytes: int = param(256 << 20, "Bytes submitted per batch_transfer_sync_read call (whole chunks).")
    timeout_s: int = param(30, "Seconds a stalled transfer waits before failing (sets MC_TRANSFER_TIMEOUT).")
    checksum: Literal["xxh3_64", "crc32"] = param("xxh3_64", "Checksum of each published chunk.")
    checksum_chunk_bytes: int = param(4 << 20, "Bytes per checksum chunk; a mismatch names the chunk's tensors.")
    verify: bool = param(True, "Pullers verify every chunk checksum; false skips it (checksum_ok is null).")
    checksum_retries: int = param(2, "A satellite pull whose checksum fails is retried this often before it is fatal.")
    log_level: Literal["INFO", "WARNING", "ERROR"] = param("ERROR", "Mooncake log level (sets MC_LOG_LEVEL).")

    def check(self) -> None:
        for key in ("chunk_bytes", "batch_bytes", "timeout_s", "checksum_chunk_bytes"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.host.strip() != "", "host", "must be an address, got an empty string")
        require(self.checksum_retries >= 0, "checksum_retries", f"must be >= 0, got {self.checksum_retries}")
        require(self.verify or self.backend != "mooncake", "verify",
                "must stay true with backend mooncake: its listeners bind every address (docs/reliability.md), so "
                "a pulled chunk is trusted only once its checksum matches")


@dataclass(frozen=True)
class OpenAIConfig:
    """The proxy's OpenAI-compatible endpoint (/runs/{run_id}/v1/...): chat template, tool outputs (docs/proxy.md)."""

    tokenizer: str | None = param(
        None, "Directory with the model's tokenizer files (an HF model dir, e.g. model.hf_path); its chat template "
              "renders the messages. null = the OpenAI endpoint answers 503 (the /generate endpoint still works).")
    model_name: str = param("gyre-policy", "The model id /v1/models lists and the answers name.")
    max_tool_output_chars: int = param(
        16000, "A tool message longer than this is cut to its first this-many characters plus a marker, "
               "the same way in every call (so later calls still extend earlier ones).")

    def check(self) -> None:
        require(self.tokenizer is None or self.tokenizer.strip() != "", "tokenizer", "must be a directory or null")
        require(self.model_name.strip() != "", "model_name", "must be a non-empty name")
        require(self.max_tool_output_chars >= 1, "max_tool_output_chars",
                f"must be >= 1, got {self.max_tool_output_chars}")


@dataclass(frozen=True)
class ProxyConfig:
    """The proxy: the one /generate endpoint agents call; routes runs to engines, moves them off leaving cells."""

    host: str = param("127.0.0.1", "Address the proxy listens on.")
    port: int = param(31000, "Port the proxy listens on.")
    routing: Literal["sticky_least_loaded", "round_robin"] = param(
        "sticky_least_loaded", "A run stays on its engine while it serves, else least-loaded; or plain rotation."
    )
    balance_abs_threshold: int = param(
        4, "sticky_least_loaded: a run leaves its engine for the least-loaded one (once nothing of it is in flight "
           "there) when that engine's requests exceed the least-loaded ACTIVE engine's by more than this AND by more "
           "than balance_rel_threshold times; when an engine joins, requests of such overloaded engines move to it "
           "(docs/proxy.md). SGLang router's cache-aware balance rule; 4 = a quarter of an engine's default 16 "
           "running slots (the router's own default, 64, is sized for GPU engines running hundreds).")
    balance_rel_threshold: float = param(
        1.5, "The relative half of the balance rule (SGLang router's default): load > this x the least load.")
    mover: Literal["kv", "reprefill"] = param(
        "kv", "How a cut request continues elsewhere: kv = move its cached KV blocks to the target over Mooncake "
              "(local engines with engine.kv_cache), falling back to re-prefill per move with the reason logged "
              "(kv_fallback); reprefill = always resubmit prompt + partial output and recompute it."
    )
    kv_version_policy: Literal["reprefill", "keep"] = param(
        "reprefill", "A KV move onto an engine serving other weights: reprefill = refuse the blocks, the target "
                     "recomputes the prefix under its weights; keep = use the old-weight K/V (the tokens keep "
                     "their recorded versions). docs/proxy.md explains the choice.")
    max_moves_per_call: int = param(8, "A call moved more often than this fails with HTTP 502 (counted as lost).")
    default_max_new_tokens: int = param(128, "max_new_tokens of a call that gives none (the engines' default).")
    request_timeout_s: float = param(600.0, "Read timeout of one engine /generate; a timeout is a broken connection.")
    connect_retries: int = param(1, "Retries of a refused connection to an engine before it counts as broken.")
    health_timeout_s: float = param(2.0, "After a broken connection /health is probed this long; no answer = DEAD.")
    no_engine_wait_s: float = param(60.0, "A call that finds no ACTIVE engine waits this long for one, then fails.")
    drain_timeout_s: float = param(60.0, "A drain waits this long for the engine's requests to leave it.")
    abort_retry_s: float = param(0.2, "While draining, /abort_request is re-sent at this interval to requests left.")
    event_log: str | None = param(None, "JSONL file the proxy appends its events to (moves, engines); null = none.")
    tito_dir: str | None = param(
        None, "The run's TITO directory: /admin/flush_tito writes only there, to a file it names by name (never a "
              "path from the request); null = flushes are refused.")
    startup_timeout_s: float = param(
        120.0, "Seconds start_proxy waits for the proxy's /health (its imports are slow on a loaded machine).")
    http: HttpConfig = param(HttpConfig(), "HTTP limits of the proxy's listener.")
    openai: OpenAIConfig = param(OpenAIConfig(), "The OpenAI-compatible chat endpoint and its chat template.")

    def check(self) -> None:
        require(1 <= self.port <= 65535, "port", f"must be a TCP port, got {self.port}")
        require(self.host.strip() != "", "host", "must be an address, got an empty string")
        for key in ("max_moves_per_call", "default_max_new_tokens"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.connect_retries >= 0, "connect_retries", f"must be >= 0, got {self.connect_retries}")
        for key in ("request_timeout_s", "health_timeout_s", "drain_timeout_s", "abort_retry_s", "startup_timeout_s"):
            require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
        require(self.no_engine_wait_s >= 0, "no_engine_wait_s", f"must be >= 0, got {self.no_engine_wait_s}")
        require(self.balance_abs_threshold >= 0, "balance_abs_threshold",
                f"must be >= 0 (requests), got {self.balance_abs_threshold}")
        require(self.balance_rel_threshold >= 1, "balance_rel_threshold",
                f"must be >= 1 (a ratio of loads), got {self.balance_rel_threshold}")
        require(self.event_log is None or self.event_log.strip() != "", "event_log", "must be a path or null")


#: The scheduling policies, named once: the loader checks ``scheduler.policy`` and ``sim.policies`` against this type
#: (``check_policy_name`` for a name that did not come through the loader); ``allocator.policies`` implements them.
PolicyName = Literal["gyre", "colocate", "async", "async_streaming", "colocate_streaming"]
POLICY_NAMES: tuple[str, ...] = typing.get_args(PolicyName)


def check_policy_name(name: str, key: str = "scheduler.policy") -> str:
    """``name`` if it names a policy; else the loader's ``ConfigError`` (the one check of a policy name)."""
    return _convert(PolicyName, name, key)


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduling policy (pure decisions): when cells switch roles and how far generation runs ahead."""

    policy: PolicyName = param(
        "gyre", "Policy of a live run: gyre (elastic cells), colocate, async, or an ablation."
    )
    batch_groups: int = param(8, "B: groups (queries) per optimizer step.")
    theta: float = param(0.5, "Gyre: a cell moves to training once ready groups stay >= theta * B for tau_s.")
    tau_s: float = param(60.0, "Gyre: seconds the ready-group condition must hold before a cell moves.")
    mu: int = param(
        1, "Training steps per burst (gyre, streaming policies): the core makes mu steps of batch_groups groups "
           "(one policy version each) before the training cells go back to rollout. Updates per step: train.epochs."
    )
    staleness_target: float = param(1.0, "E[d]: target mean per-token policy-version lag of trained tokens.")
    staleness_gain: float = param(0.75, "Integral gain of the admission window (batches per unit of lag error).")
    max_window_batches: float = param(8.0, "Admitted-but-untrained groups never exceed this many batches.")
    max_staleness: int | None = param(None, "Hard bound: tokens with a larger lag are masked from the loss.")
    staleness_max: float | None = param(
        None, "Hard bound on the mean: while the measured E[d] is at or above it, admission stops at one batch.")
    async_train_cells: int = param(2, "Async policies: cells in the fixed training pool (the rest roll out).")
    capacity_runs_per_cell: int = param(64, "Capacity model: unfinished runs one rollout cell absorbs.")
    satellite_min_work_s: float = param(
        300.0, "Gyre: a satellite joins only if the training backlog per training cell exceeds this (s)."
    )

    def check(self) -> None:
        require(0.0 < self.theta <= 1.0, "theta", f"must be in (0, 1], got {self.theta}")
        for key in ("batch_groups", "mu", "async_train_cells", "capacity_runs_per_cell"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("tau_s", "staleness_target", "staleness_gain", "satellite_min_work_s"):
            require(getattr(self, key) >= 0, key, f"must be >= 0, got {getattr(self, key)}")
        require(self.max_window_batches >= 1, "max_window_batches", f"must be >= 1, got {self.max_window_batches}")
        require(self.max_staleness is None or self.max_staleness >= 0, "max_staleness",
                f"must be >= 0 or null, got {self.max_staleness}")
        require(self.staleness_max is None or self.staleness_max >= self.staleness_target, "staleness_max",
                f"must be >= staleness_target = {self.staleness_target} or null, got {self.staleness_max}")


@dataclass(frozen=True)
class AllocatorConfig:
    """The live allocator (rank 0): when a live run stops, heartbeats, polling, orderly shutdown, event log."""

    steps: int = param(10, "Optimizer steps of a live run; after the last one the allocator shuts every cell down.")
    heartbeat_interval_s: float = param(1.0, "A cell sends a heartbeat when it has sent nothing for this long.")
    heartbeat_timeout_s: float = param(
        30.0, "A cell silent this long is LOST (logged, its runs re-homed, never given an order again)."
    )
    hello_timeout_s: float = param(600.0, "A cell that has not said Hello this long after the allocator started is LOST.")
    poll_backoff_min_s: float = param(1e-4, "First sleep of an idle polling loop; it doubles after every empty poll.")
    poll_backoff_max_s: float = param(5e-3, "Longest sleep of an idle polling loop (the reaction-time bound).")
    shutdown_timeout_s: float = param(30.0, "Seconds the allocator waits for every cell's Bye after sending Shutdown.")
    events_file: str = param("events.jsonl", "Event log (JSONL) in the run directory: every order, switch and loss.")
    max_lost_group_share: float = param(
        0.05, "A live run stops with an error once more than this share of its groups is lost (TITO records missing, "
              "cut or inconsistent with what the proxy served; of max(steps x batch_groups, groups completed)); "
              "0 = at the first.")
    preempt_inflight: Literal["reissue", "drop"] = param(
        "reissue", "Queries still running at a preemption: reissue = the resumed run starts them again first; "
        "drop = they are not run again (counted as queries_dropped_at_preempt in the summary)."
    )

    def check(self) -> None:
        require(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}")
        require(0.0 <= self.max_lost_group_share <= 1.0, "max_lost_group_share",
                f"must be in [0, 1], got {self.max_lost_group_share}")
        for key in ("heartbeat_interval_s", "hello_timeout_s", "poll_backoff_min_s", "shutdown_timeout_s"):
            require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
        require(self.heartbeat_timeout_s >= 2 * self.heartbeat_interval_s, "heartbeat_timeout_s",
                f"must be >= 2 x heartbeat_interval_s = {2 * self.heartbeat_interval_s} (one late beat is not a "
                f"loss), got {self.heartbeat_timeout_s}")
        require(self.poll_backoff_max_s >= self.poll_backoff_min_s, "poll_backoff_max_s",
                f"must be >= poll_backoff_min_s = {self.poll_backoff_min_s}, got {self.poll_backoff_max_s}")
        require(self.events_file.strip() != "" and "/" not in self.events_file, "events_file",
                f"must be a file name inside the run directory, got {self.events_file!r}")


@dataclass(frozen=True)
class WorkloadConfig:
    """Simulated agent runs: a parametric model (turns x per-turn cost) or a trace of a real job."""

    trace: str | None = param(None, "JSONL trace of runs (docs/simulator.md); null = the parametric model.")
    runs_per_query: int = param(8, "Runs per query (the group size); a trace gives its own groups.")
    timeout_h: float = param(6.0, "Per-run wall-clock timeout in hours; partial work of a timed-out run is kept.")
    turns_median: float = param(100.0, "Median number of turns of a run.")
    query_sigma: float = param(0.5, "Lognormal sigma of the per-query factor on turns (query difficulty).")
    run_sigma: float = param(0.3, "Lognormal sigma of run-to-run variation of turns within a query.")
    stuck_query_frac: float = param(0.0, "Fraction of queries whose runs never finish (always hit the timeout).")
    decode_tokens_per_turn: float = param(400.0, "Decode (output) tokens per turn.")
    prefill_tokens_per_turn: float = param(3000.0, "New context tokens prefilled per turn (tool output, prompt).")
    tool_s_per_turn: float = param(20.0, "Tool / environment seconds per turn (not slowed by engine load).")
    path_turns: float | None = param(
        None, "Turns between context compressions (each starts a new path); null = one path per run. "
              "The simulator trains a run's last trajectory.j_max paths."
    )

    def check(self) -> None:
        require(self.runs_per_query >= 1, "runs_per_query", f"must be >= 1, got {self.runs_per_query}")
        require(self.timeout_h > 0, "timeout_h", f"must be > 0, got {self.timeout_h}")
        require(self.turns_median > 0, "turns_median", f"must be > 0, got {self.turns_median}")
        for key in ("query_sigma", "run_sigma", "decode_tokens_per_turn", "prefill_tokens_per_turn",
                    "tool_s_per_turn"):
            require(getattr(self, key) >= 0, key, f"must be >= 0, got {getattr(self, key)}")
        require(0.0 <= self.stuck_query_frac < 1.0, "stuck_query_frac", f"must be in [0, 1), got {self.stuck_query_frac}")
        require(self.path_turns is None or self.path_turns > 0, "path_turns", f"must be > 0 or null, got {self.path_turns}")


@dataclass(frozen=True)
class SimConfig:
    """The simulator: which policies to compare, for how many steps, and the physics of a cell."""

    policies: tuple[PolicyName, ...] = param(("gyre", "colocate", "async"), "Policies to simulate and compare.")
    steps: int = param(48, "Optimizer steps to simulate; wall time is the time of the last step.")
    decode_tok_s: float = param(30.0, "Per-request decode tokens/s of an unloaded engine.")
    prefill_tok_s: float = param(5000.0, "Per-request prefill tokens/s of an unloaded engine.")
    half_load: float = param(64.0, "Concurrent runs per cell at which per-request engine speed halves.")
    kv_slots_per_cell: int = param(256, "Hard limit of concurrent runs per rollout cell (KV cache); more wait.")
    engine_slots: int | None = param(
        None, "Requests one engine decodes at once (a live engine's max_running_requests); more runs on a cell "
              "take turns (each gets engine_slots / runs of the engine). null = no limit below kv_slots_per_cell.")
    load_model: Literal["runs", "calls"] = param(
        "runs", "What loads an engine: runs = every run on the cell (the paper's fit); calls = only the runs inside "
                "a model call, tool waits free the engine (the live engine's running requests; a replay of an "
                "emulated device uses it).")
    train_tok_s_per_cell: float = param(50000.0, "Training tokens/s (forward+backward) of one cell.")
    optimizer_s: float = param(30.0, "Seconds the core needs to apply one optimizer step.")
    weight_bytes: float = param(1e9, "Bytes of the model weights a satellite pulls from the core.")
    pull_bytes_per_s: float = param(1e9, "Bandwidth of one satellite's weight pull (bytes/s).")
    to_train_s: float = param(8.52, "Seconds of a rollout->training switch (measured on the 122B model).")
    to_rollout_s: float = param(3.46, "Seconds of a training->rollout switch (measured on the 122B model).")
    kv_transfer_s: float = param(2.0, "Seconds to move a run to another cell with its KV blocks (RDMA).")
    reprefill_tokens: float = param(60000.0, "Context tokens a paused run recomputes when its KV was dropped.")
    max_events: int = param(5_000_000, "Safety stop: a simulation with more events is an error.")

    def check(self) -> None:
        require(len(self.policies) >= 1, "policies", "must name at least one policy")
        require(len(set(self.policies)) == len(self.policies), "policies", "must not repeat a policy")
        for key in ("steps", "kv_slots_per_cell", "max_events"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.engine_slots is None or self.engine_slots >= 1, "engine_slots",
                f"must be >= 1 or null, got {self.engine_slots}")
        for key in ("decode_tok_s", "prefill_tok_s", "half_load", "train_tok_s_per_cell", "weight_bytes",
                    "pull_bytes_per_s"):
            require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
        for key in ("optimizer_s", "to_train_s", "to_rollout_s", "kv_transfer_s", "reprefill_tokens"):
            require(getattr(self, key) >= 0, key, f"must be >= 0, got {getattr(self, key)}")


@dataclass(frozen=True)
class MiniSweAgentConfig:
    """agent.kind mini-swe-agent: the pinned, unmodified package in its own venv, its commands sandboxed (docs/agents.md)."""

    python: str | None = param(None, "The venv interpreter that has mini-swe-agent; null = $GYRE_MSWEA_VENV or the "
                                     "venv `scripts/setup.sh --mini-swe-agent` makes (~/.cache/gyre_hpc).")
    step_limit: int = param(8, "Model calls per run (the package's step_limit; cost tracking is off, so always set).")
    command_timeout_s: float = param(30.0, "Wall-clock limit of one bash command the agent runs (its group is killed).")
    cpu_s: int = param(120, "RLIMIT_CPU of the agent process and of each command, in CPU seconds.")
    memory_mb: int = param(4096, "RLIMIT_AS of the agent process and of each command, in MiB.")
    file_mb: int = param(64, "RLIMIT_FSIZE: the largest file the agent or a command may write, in MiB.")
    isolation: Literal["auto", "required", "off"] = param(
        "auto", "Sandbox of the agent's commands (no network, read-only filesystem outside the workspace, no "
                "capabilities): auto = when root with unshare, required = refuse to run without it, off = never.")

    def check(self) -> None:
        require(self.python is None or self.python.strip() != "", "python", "must be a path or null")
        for key in ("step_limit", "cpu_s", "memory_mb", "file_mb"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(self.command_timeout_s > 0, "command_timeout_s", f"must be > 0, got {self.command_timeout_s}")


@dataclass(frozen=True)
class AgentConfig:
    """The synthetic long-horizon agent workload of live runs (docs/agent-workload.md): task, branching, timing."""

    runs_per_group: int = param(4, "Runs per query (a group); the harness runs them concurrently.")
    system_tokens: int = param(6, "System prompt length: the SYS marker and tokens drawn once from run.seed.")
    task_tokens: int = param(8, "Task tokens per query; the hidden key is their sum modulo key_classes.")
    key_classes: int = param(2, "m: an answer token t is right iff (t - first content id) % m == key; chance is 1/m.")
    turns: tuple[int, ...] = param((2, 4), "[min, max] tool-call turns of the main agent before it answers (per query).")
    call_tokens: int = param(6, "max_new_tokens of a tool-call turn (the call's arguments; also a draft).")
    answer_tokens: int = param(8, "max_new_tokens of the answer turn, and the score's denominator.")
    tool_output_tokens: tuple[int, ...] = param((2, 8), "[min, max] filler tokens a successful tool returns.")
    tool_time_median_s: float = param(0.05, "Median seconds of one tool call (lognormal).")
    tool_time_sigma: float = param(1.0, "Lognormal sigma of tool times (long tail: p99 = median * e^(2.33 sigma)).")
    tool_failure_prob: float = param(0.15, "Probability that a tool call fails (ERR instead of the key).")
    max_retries: int = param(2, "A failed tool call is retried this often, re-issuing the model call from its input.")
    subagent_prob: float = param(0.15, "Probability that a main-agent tool call is delegated to a subagent.")
    subagent_turns: tuple[int, ...] = param((1, 2), "[min, max] tool-call turns of a subagent.")
    context_budget: int = param(96, "A context whose next call would exceed this many tokens is compressed first.")
    timeout_s: float = param(20.0, "Per-run wall-clock timeout in seconds (the harness enforces it).")
    partial_scoring: bool = param(True, "Grade the last draft of a timed-out run (timeout_partial); false: unscorable.")
    eval_failure_rate: float = param(0.0, "Injected probability that grading a run fails (eval_failure, never a 0).")
    temperature: float = param(1.0, "Sampling temperature sent to the engine.")
    top_p: float = param(1.0, "Nucleus sampling threshold sent to the engine.")
    top_k: int = param(-1, "Top-k sampling sent to the engine; -1 = off.")
    seeded_sampling: bool = param(True, "Send a sampling_seed per call derived from run.seed, run and call id.")
    abort_retries: int = param(2, "A /generate answered with finish_reason abort is re-issued this often, then the "
                                  "run ends aborted.")
    kind: Literal["synthetic", "python", "command", "mini-swe-agent"] = param(
        "synthetic", "Which agent runs: the synthetic token game (default), a Python plugin (agent.entry), a "
                     "command (agent.argv) or mini-swe-agent (agent.mini_swe_agent); plugins talk OpenAI chat "
                     "completions (docs/agents.md).")
    entry: str | None = param(None, "kind python: the agent callable as 'pkg.module:run' (sync or async), called "
                                    "with task, base_url, api_key, workspace.")
    argv: tuple[str, ...] = param((), "kind command: the agent's argv; cwd = a fresh workspace, OPENAI_BASE_URL and "
                                      "OPENAI_API_KEY set per run, GYRE_TASK holds the task statement.")
    tasks_dir: str | None = param(None, "kind python/command: the directory of repository-repair tasks (tasks/).")
    mini_swe_agent: MiniSweAgentConfig = param(MiniSweAgentConfig(), "kind mini-swe-agent: its venv, limits, sandbox.")

    def min_budget(self) -> int:
        """The smallest context_budget in which a compressed context still fits its next call."""
        longest = max(self.call_tokens, self.answer_tokens)
        return self.system_tokens + 4 + max(self.task_tokens, self.call_tokens) + longest

    def check(self) -> None:
        for key in ("runs_per_group", "system_tokens", "task_tokens", "call_tokens", "answer_tokens"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(1 <= self.key_classes <= 16, "key_classes", f"must be in [1, 16], got {self.key_classes}")
        for key, low in (("turns", 0), ("tool_output_tokens", 0), ("subagent_turns", 1)):
            v = getattr(self, key)
            require(len(v) == 2 and low <= v[0] <= v[1], key, f"must be [min, max] with {low} <= min <= max, got {list(v)}")
        for key in ("tool_failure_prob", "subagent_prob", "eval_failure_rate"):
            require(0.0 <= getattr(self, key) <= 1.0, key, f"must be in [0, 1], got {getattr(self, key)}")
        for key in ("tool_time_median_s", "timeout_s"):
            require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
        for key in ("tool_time_sigma", "temperature", "max_retries", "abort_retries"):
            require(getattr(self, key) >= 0, key, f"must be >= 0, got {getattr(self, key)}")
        require(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        require(self.top_k == -1 or self.top_k >= 1, "top_k", f"must be -1 or >= 1, got {self.top_k}")
        require(self.context_budget >= self.min_budget(), "context_budget",
                f"must be >= {self.min_budget()} (a compressed context plus its next call), got {self.context_budget}")
        check_plugin_fields(self)


#: ``pkg.module:attr`` (dotted module path, a colon, a dotted attribute path).
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
ENTRY_FORMAT = re.compile(rf"^{_DOTTED}:{_DOTTED}$")


def check_entry(value: str | None, key: str) -> None:
    """Raise ``FieldError(key, ...)`` unless ``value`` is None or of the form ``pkg.module:attr``."""
    require(value is None or bool(ENTRY_FORMAT.match(value)), key,
            f"must be 'pkg.module:callable', got {value!r}")


def check_plugin_fields(agent: "AgentConfig") -> None:
    """The plugin keys of the agent section agree with its kind (importing happens later: agents.plugins)."""
    check_entry(agent.entry, "entry")
    if agent.kind == "python":
        require(agent.entry is not None, "entry", "is required with agent.kind python ('pkg.module:run')")
    if agent.kind == "command":
        require(len(agent.argv) > 0 and all(agent.argv), "argv", f"must be a non-empty argv with agent.kind "
                                                                  f"command, got {list(agent.argv)}")
    if agent.kind != "synthetic":
        require(agent.tasks_dir is not None, "tasks_dir", f"is required with agent.kind {agent.kind}")


@dataclass(frozen=True)
class GraderConfig:
    """How a plugin agent's run is graded: the task's hidden tests in a sandbox, or a grader plugin (docs/agents.md)."""

    entry: str | None = param(None, "A grader callable 'pkg.module:grade' (task, workspace) -> score in [0, 1]; "
                                    "null = run the task's hidden tests (share passed). Raising = eval_failure.")
    timeout_s: float = param(60.0, "Wall-clock limit of one grading; past it the run is an eval_failure.")
    cpu_s: int = param(60, "RLIMIT_CPU of the hidden-test process, in CPU seconds.")
    memory_mb: int = param(2048, "RLIMIT_AS of the hidden-test process, in MiB.")
    file_mb: int = param(64, "RLIMIT_FSIZE: the largest file the hidden-test process may write, in MiB.")
    isolation: Literal["auto", "required", "off"] = param(
        "auto", "Sandbox of the hidden tests (no network, read-only filesystem outside the workspace, no capabilities): "
                "auto = when root with unshare, required = refuse to grade without it, off = never.")

    def check(self) -> None:
        check_entry(self.entry, "entry")
        require(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
        for key in ("cpu_s", "memory_mb", "file_mb"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")


@dataclass(frozen=True)
class SlurmConfig:
    """The sbatch job that runs ``gyre train`` on a SLURM cluster (docs/slurm.md); rendered by gyre_hpc.slurm.sbatch."""

    job_name: str = param("gyre", "#SBATCH --job-name (%x in output paths).")
    partition: str | None = param(None, "#SBATCH --partition; null = the cluster's default partition.")
    account: str | None = param(None, "#SBATCH --account to charge; null = the user's default account.")
    time: str = param("01:00:00", "#SBATCH --time limit as HH:MM:SS (hours may exceed 24, e.g. 48:00:00).")
    cpus_per_task: int = param(1, "#SBATCH --cpus-per-task: CPUs of each node's task (GPUs come from cluster).")
    mem: str | None = param(None, "#SBATCH --mem per node, e.g. 512G or 0 (all); null = the partition default.")
    output: str = param("runs/%x-%j.out", "#SBATCH --output pattern (%j job id, %x job name); its directory must "
                                          "exist at submission (gyre submit points it into its run directory).")
    error: str = param("runs/%x-%j.err", "#SBATCH --error pattern, like output.")
    signal: str = param("USR1@300", "Preemption warning as SIG@seconds: SLURM sends SIG to the batch shell that many "
                                    "seconds before the time limit, and the shell forwards it to the training step.")
    requeue: bool = param(True, "#SBATCH --requeue (true) or --no-requeue: may SLURM requeue a preempted job. With "
                                "true the logs are appended (--open-mode=append) and a step that ends preempted "
                                "(exit 75: resume state saved) makes the script requeue its own job.")
    max_requeues: int = param(3, "How often the script requeues its own job after a preemption (SLURM_RESTART_COUNT); "
                                 "0 = never: the job ends and `gyre train CONFIG --resume RUN_DIR` continues it.")
    extra: tuple[str, ...] = param((), "More #SBATCH options as --key=value or --flag, e.g. --qos=high; only "
                                        "options in gyre_hpc.slurm.sbatch.EXTRA_OPTIONS are accepted.")
    exports: tuple[str, ...] = param((), "KEY=VALUE environment variables exported before the launch.")
    setup: tuple[str, ...] = param((), "Shell lines run before the launch, e.g. 'module load cuda/12.4'.")
    python: str = param("python3", "The Python interpreter on the compute nodes that has gyre_hpc installed.")
    local_cluster: bool = param(False, "The local emulated cluster (scripts/local-slurm.sh): export Open MPI's "
                                       "loopback-only TCP settings. Never on a production cluster.")

    def check(self) -> None:
        from gyre_hpc.launcher.slurm_options import check_slurm  # stdlib only: the formats sit below config

        check_slurm(self)


@dataclass(frozen=True)
class TrackingConfig:
    """Experiment tracking of live runs (rank 0; gyre_hpc.tracking): the metrics.jsonl records, the resolved config,
    the report PNGs and the summary go to every backend named here (docs/runtime.md, "Experiment tracking")."""

    backends: tuple[Literal["tensorboard", "wandb", "mlflow"], ...] = param(
        ("tensorboard",), "Backends: tensorboard (RUN_DIR/tensorboard), wandb (offline unless WANDB_MODE says "
        "otherwise; RUN_DIR/wandb; WANDB_PROJECT, WANDB_ENTITY), mlflow (RUN_DIR/mlruns or mlflow_uri); [] = off.")
    mlflow_uri: str | None = param(None, "MLflow tracking URI (e.g. http://127.0.0.1:5000); null = a local store "
                                         "in RUN_DIR/mlruns.")
    project: str = param("gyre", "W&B project (WANDB_PROJECT wins) and MLflow experiment name.")
    images_every_steps: int = param(0, "Log the report PNGs every this many steps too (0 = only at the end).")
    buffer_steps: int = param(10000, "Records a backend may hold while it fails (retried with back-off); beyond "
                                     "that the oldest are dropped and counted (event tracking_error).")
    retry_s: float = param(2.0, "First back-off after a backend failed; doubles up to 60 s.")
    close_timeout_s: float = param(120.0, "At the end, how long rank 0 waits for a backend to take what it holds.")

    def check(self) -> None:
        require(len(set(self.backends)) == len(self.backends), "backends", f"repeats a backend: {list(self.backends)}")
        require(self.images_every_steps >= 0, "images_every_steps", f"must be >= 0, got {self.images_every_steps}")
        require(self.buffer_steps >= 1, "buffer_steps", f"must be >= 1, got {self.buffer_steps}")
        require(self.retry_s > 0, "retry_s", f"must be > 0, got {self.retry_s}")
        require(self.close_timeout_s >= 0, "close_timeout_s", f"must be >= 0, got {self.close_timeout_s}")


@dataclass(frozen=True)
class GyreConfig:
    """The root: one section per component. Components receive their section, never this object."""

    run: RunConfig = param(RunConfig(), "Run directory and seed.")
    cluster: ClusterConfig = param(ClusterConfig(), "Cells of the allocation.")
    trajectory: TrajectoryConfig = param(TrajectoryConfig(), "Trajectory processing.")
    engine: EngineConfig = param(EngineConfig(), "Rollout engines (SGLang protocol).")
    model: ModelConfig = param(ModelConfig(), "The policy model (megatron-core GPTModel).")
    train: TrainConfig = param(TrainConfig(), "The training step and optimizer.")
    transfer: TransferConfig = param(TransferConfig(), "Weight transfer between cells.")
    scheduler: SchedulerConfig = param(SchedulerConfig(), "Scheduling policy (role switches, staleness).")
    allocator: AllocatorConfig = param(AllocatorConfig(), "Live allocator: heartbeats, shutdown, stop condition.")
    workload: WorkloadConfig = param(WorkloadConfig(), "Simulated agent workload (parametric or trace).")
    sim: SimConfig = param(SimConfig(), "Simulator: compared policies, steps, cell physics.")
    proxy: ProxyConfig = param(ProxyConfig(), "The proxy agents call: routing, TITO recording, moves.")
    agent: AgentConfig = param(AgentConfig(), "Synthetic agent workload of live runs (harness).")
    grader: GraderConfig = param(GraderConfig(), "Grading of plugin agents' runs: hidden tests or a grader plugin.")
    slurm: SlurmConfig = param(SlurmConfig(), "The sbatch job: partition, time limit, preemption signal, exports.")
    tracking: TrackingConfig = param(TrackingConfig(), "Experiment tracking: TensorBoard, W&B (offline), MLflow.")

    def check(self) -> None:
        ep, experts = self.train.expert_parallel, self.model.experts
        require(ep == 1 or (experts > 0 and experts % ep == 0), "train.expert_parallel",
                f"{ep} must divide model.experts={experts} (and needs a MoE model, experts > 0)")
        require(experts == 0 or self.cluster.tensor_parallel == 1, "cluster.tensor_parallel",
                f"{self.cluster.tensor_parallel} with model.experts={experts}: a MoE model trains with "
                f"tensor_parallel 1 (experts split by train.expert_parallel instead)")


# ----------------------------------------------------------------------------------------------- loader
_EXPONENT_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{key}: null is not allowed (expected {_type_name(tp)})")
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item,) = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return tuple(_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return build(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _EXPONENT_FLOAT.match(value):
            value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {tp!r}")  # a programming error in a section


def build(cls: type, data: Mapping[str, Any], path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; errors name the dotted key under ``path``."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(
            f"unknown key {where}{unknown[0]}; valid keys{' of ' + path if path else ''}: {', '.join(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, f"{path}.{name}" if path else name)
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        try:
            check()
        except FieldError as exc:
            raise ConfigError(f"{path + '.' if path else ''}{exc.key}: {exc.message}") from None
    return obj


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=1.5"`` → (["a", "b"], 1.5); the value is parsed as a YAML scalar or flow list."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc.problem})") from None
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: Sequence[str], root: type = None) -> dict:
    """Return a deep copy of raw ``data`` with each ``key.path=value`` set; unknown keys fail here."""
    import copy

    root = root or GyreConfig
    data = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        cls, node = root, data
        for depth, key in enumerate(keys):
            names = [f.name for f in dataclasses.fields(cls)]
            dotted = ".".join(keys[: depth + 1])
            if key not in names:
                parent = ".".join(keys[:depth]) or "the root"
                raise ConfigError(f"unknown key {dotted}; valid keys of {parent}: {', '.join(names)}")
            if depth == len(keys) - 1:
                node[key] = value
                break
            sub = typing.get_type_hints(cls)[key]
            if not dataclasses.is_dataclass(sub):
                raise ConfigError(f"{dotted} is a value, not a section; cannot set {'.'.join(keys)}")
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{dotted}: expected a mapping in the config file, got {node!r}")
            cls = sub
    return data


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping; a missing file or a syntax error is a ``ConfigError`` naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise ConfigError(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


#: keys holding a file path: a relative path written in a config file is relative to that file's directory
FILE_RELATIVE_KEYS = (("workload", "trace"),)


def resolve_relative(data: dict, base: Path) -> dict:
    """``data`` with each relative path of ``FILE_RELATIVE_KEYS`` joined to ``base`` (the file's directory)."""
    for keys in FILE_RELATIVE_KEYS:
        node = data
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        value = node.get(keys[-1]) if isinstance(node, dict) else None
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            node[keys[-1]] = str(base / value)
    return data


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (), root: type = None) -> Any:
    """Load ``path`` (or the defaults when None), apply overrides, and build the frozen root config.

    A relative ``workload.trace`` in the file resolves against the file's directory; one given by an
    override (``--set``) against the working directory, as any command-line path."""
    root = root or GyreConfig
    data = resolve_relative(read_yaml(path), Path(path).resolve().parent) if path is not None else {}
    return build(root, apply_overrides(data, overrides, root))


def overlay_overrides(path: str | Path) -> list[str]:
    """A YAML overlay file (a partial config, e.g. what ``gyre tune`` writes) as ``key.path=value`` overrides,
    so that it composes with ``--set`` in command-line order and passes the same strict checks."""
    import json

    def flat(node: Any, prefix: str) -> list[str]:
        if isinstance(node, dict):
            return [o for k, v in node.items() for o in flat(v, f"{prefix}{k}.")]
        return [f"{prefix[:-1]}={json.dumps(node)}"]

    return flat(read_yaml(path), "")


def to_dict(cfg: Any) -> dict:
    """Plain nested dict (tuples become lists) — what ``yaml.safe_dump`` writes into a run directory."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v

    return plain(cfg)


def explain(cls: type = None, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) for every leaf field, in declaration order."""
    cls = cls or GyreConfig
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        doc = f.metadata.get("doc", "")
        if dataclasses.is_dataclass(tp):
            rows.append((key, "section", "", doc))
            rows.extend(explain(tp, key + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rows.append((key, _type_name(tp), repr(to_dict(default)), doc))
    return rows
