"""A run's initial model: a Qwen3-format model without ``model.hf_path`` becomes one real HF directory, made once.

::

    RUN_DIR/model/init/    config.json, model.safetensors, generation_config.json,
                           tokenizer.json, tokenizer_config.json, chat_template.jinja   (``gyre_hpc.models.init``)

A model section that is Qwen3-format (``model.qk_layernorm: true``, as configs/local.yaml) and names no
``model.hf_path`` has its initial weights written as a ``Qwen3ForCausalLM`` directory (``Qwen3MoeForCausalLM`` with ``model.experts``) (random weights from
``run.seed``, the locally trained tokenizer with its chat template) before any rank starts. ``for_run`` then points
``model.hf_path`` there, and ``engine.model_path`` too when ``engine.kind`` is sglang: the trainer, the local engine
and SGLang load the same checkpoint, and ``gyre model check RUN_DIR/model/init`` compares it with megatron.

Invariants
- Deterministic: the same model fields and ``run.seed`` give byte-identical files (``init_model``'s invariant).
- Once per run: an existing directory is reused, never regenerated (a resume continues from the same weights).
- Made once per machine: ``init_model`` (seconds: it imports torch and transformers) runs into a cache directory
  (``$XDG_CACHE_HOME/gyre/init-models/<key>``, key = the sha256 of init_model's arguments, the torch, transformers
  and tokenizers versions and the source of the modules that write the files); a run copies its files from there.
  The copy is byte-identical to a fresh ``init_model`` (determinism); an unwritable cache falls back to writing
  RUN_DIR/model/init directly.
- ``for_run`` is a pure function of (config, whether the directory exists): the launcher, every rank and a resume
  derive the same config, so RUN_DIR/config.yaml and the resume check agree.
- A model that is not Qwen3-format (``qk_layernorm: false``) or already has ``hf_path`` is left as it is (megatron's
  random init from ``run.seed``, or that checkpoint).
- A Qwen3-format model with a field Qwen3 cannot express (LayerNorm, learned positions, a GELU MLP, q/k/v biases,
  a vocabulary without room for the tokenizer) is a ``ConfigError`` naming the field, before anything is written.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from gyre_hpc.config import GyreConfig, ModelConfig
from gyre_hpc.errors import ConfigError
from gyre_hpc.rundir import RunDir

INIT_DIR = ("model", "init")
#: what a Qwen3 checkpoint is (hf_config.model_fields); a Qwen3-format model section must agree
QWEN3_FIXED = {"position_embedding": "mrope", "normalization": "RMSNorm", "swiglu": True, "qkv_bias": False}


def init_dir(run_dir: str | Path) -> Path:
    return Path(run_dir).joinpath(*INIT_DIR)


def init_args(cfg: GyreConfig) -> dict:
    """The keyword arguments of ``init_model`` for ``cfg``'s model section and ``run.seed``."""
    m = cfg.model
    moe = dict(experts=m.experts, topk=m.experts_topk, moe_ffn=m.moe_ffn, norm_topk=m.norm_topk) if m.experts else {}
    return dict(hidden=m.hidden, layers=m.layers, heads=m.heads, kv_heads=m.kv_heads or m.heads, vocab=m.vocab_size,
                context=m.max_seq_len, seed=cfg.run.seed, head_dim=m.head_dim, ffn=m.ffn, tie=m.tie_embeddings,
                rope_theta=float(m.rotary_base), norm_eps=m.norm_eps, **moe)


def arch_of(args: dict) -> str:
    """``init_model``'s arch for ``init_args``: qwen3_moe when the model has experts, else qwen3."""
    return "qwen3_moe" if args.get("experts") else "qwen3"


def cache_key(args: dict) -> str:
    """What the files of ``init_model("qwen3", **args)`` depend on: the arguments, the library versions, the code."""
    from importlib.metadata import version

    here = Path(__file__).parent
    source = hashlib.sha256(b"".join((here / f).read_bytes() for f in ("init.py", "chat_template.py"))).hexdigest()
    spec = {"arch": arch_of(args), **args, "source": source,
            "versions": {lib: version(lib) for lib in ("torch", "transformers", "tokenizers", "safetensors")}}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gyre" / "init-models"


def wanted(model: ModelConfig) -> bool:
    """True when the run's initial weights are materialised as an HF directory (Qwen3-format, no hf_path)."""
    return model.hf_path is None and model.qk_layernorm


def check_qwen3(model: ModelConfig) -> None:
    """Every field of a Qwen3-format model section is one a Qwen3 checkpoint can hold, else a ConfigError."""
    from gyre_hpc.models.init import MIN_VOCAB

    for key, value in QWEN3_FIXED.items():
        if getattr(model, key) != value:
            raise ConfigError(f"model.{key}: {getattr(model, key)!r}, but model.qk_layernorm: true makes the model "
                              f"a Qwen3 checkpoint, which has {key} {value!r}; set it, or qk_layernorm: false "
                              f"for a megatron-only model")
    if model.vocab_size < MIN_VOCAB:
        raise ConfigError(f"model.vocab_size: {model.vocab_size}; a Qwen3-format model (qk_layernorm: true) gets a "
                          f"trained tokenizer, which needs >= {MIN_VOCAB} tokens")


def materialise(cfg: GyreConfig, run_dir: str | Path) -> Path | None:
    """Write RUN_DIR/model/init when ``cfg`` wants it and it is not there yet; its path (None: not wanted)."""
    if not wanted(cfg.model):
        return None
    check_qwen3(cfg.model)
    out = init_dir(run_dir)
    if out.is_dir():
        return out
    from gyre_hpc.files.io import atomic_dir

    args = init_args(cfg)
    try:
        cached = _cached(args)
        with atomic_dir(out) as tmp:
            tmp.chmod(0o755)
            for f in sorted(cached.iterdir()):
                shutil.copy2(f, tmp / f.name)
        return out
    except OSError:  # no writable cache (or it changed under us): this run's own copy
        from gyre_hpc.models.init import init_model

        return init_model(arch_of(args), out, **args)


def _cached(args: dict) -> Path:
    """The cache directory holding ``init_model("qwen3", **args)``'s files, written now if missing."""
    from gyre_hpc.models.init import init_model

    path = cache_root() / cache_key(args)
    if not path.is_dir():
        init_model(arch_of(args), path, overwrite=True, **args)  # a concurrent writer writes the same bytes
    return path


def prepare(cfg: GyreConfig, run_dir: str | Path, who: str) -> GyreConfig:
    """A new run's config, resolved: RUN_DIR/model/init written first when ``cfg`` wants it and it is not there yet
    (one line on stderr naming the command ``who``), then ``for_run``. The launcher of a run (and ``gyre serve``)
    calls it before any rank starts; what it returns is what RUN_DIR/config.yaml holds (``gyre_hpc.rundir``)."""
    if wanted(cfg.model) and not init_dir(run_dir).is_dir():
        print(f"{who}: writing the initial model to {init_dir(run_dir)}", file=sys.stderr, flush=True)
        materialise(cfg, run_dir)
    return for_run(cfg, run_dir)


def new_run(cfg: GyreConfig, who: str, absolute: bool = False,
            path: str | Path | None = None) -> tuple[Path, GyreConfig]:
    """The run directory of a new run (``path``, else a fresh one under ``run.out_dir``) holding its config, resolved
    (``prepare``) before it is written: every entry point that starts a run (train, submit, sweep, the submitit API)
    writes the config its ranks, and a requeued job's resume check, read back. A directory made here is removed
    again if the initial model or the config cannot be written (``RunDir.write_config``)."""
    rundir = RunDir.at(path) if path is not None else RunDir.new(cfg.run.out_dir, cfg.run.name, absolute=absolute)
    try:
        cfg = prepare(cfg, rundir.path, who)
    except BaseException:
        rundir.discard_if_fresh()
        raise
    rundir.write_config(cfg)
    return rundir.path, cfg


def for_run(cfg: GyreConfig, run_dir: str | Path) -> GyreConfig:
    """``cfg`` with ``model.hf_path`` (and, for sglang engines, ``engine.model_path``) set to RUN_DIR/model/init
    when it wants one and the directory exists; else ``cfg`` unchanged."""
    if not wanted(cfg.model) or not init_dir(run_dir).is_dir():
        return cfg
    path = str(init_dir(run_dir).resolve())
    model = dataclasses.replace(cfg.model, hf_path=path)  # __post_init__ checks the fields against config.json
    engine = cfg.engine
    if engine.kind == "sglang" and engine.model_path is None:
        engine = dataclasses.replace(engine, model_path=path)
    return dataclasses.replace(cfg, model=model, engine=engine)
