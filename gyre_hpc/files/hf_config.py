"""A Hugging Face ``config.json`` (dense Qwen2 / Qwen3) → the fields of ``ModelConfig``, and back.

Pure: reads JSON with the standard library, imports neither torch nor transformers.

==========================  ===========================  ======================================================
HF config key               ModelConfig field            note
==========================  ===========================  ======================================================
vocab_size                  vocab_size
hidden_size                 hidden
num_hidden_layers           layers
num_attention_heads         heads
num_key_value_heads         kv_heads                     missing = heads
intermediate_size           ffn                          gated: [gate; up] each of this size
max_position_embeddings     max_seq_len
head_dim                    head_dim                     Qwen3 (may differ from hidden / heads); Qwen2: null
rope_parameters.rope_theta  rotary_base                  falls back to ``rope_theta``, then 10000
rms_norm_eps                norm_eps                     Qwen: 1e-6 (megatron's default is 1e-5)
tie_word_embeddings         tie_embeddings
(architecture)              qk_layernorm, qkv_bias       Qwen3: q/k RMSNorm, no bias; Qwen2: q/k/v bias
(fixed)                     position_embedding=mrope, normalization=RMSNorm, swiglu=true
num_experts                 experts                      Qwen3-MoE (transformers 5 writes num_local_experts)
num_experts_per_tok         experts_topk                 Qwen3-MoE
moe_intermediate_size       moe_ffn                      Qwen3-MoE
norm_topk_prob              norm_topk                    Qwen3-MoE
==========================  ===========================  ======================================================

Invariants
- Only ``SUPPORTED`` architectures map; anything else, or a variant the mapping cannot reproduce exactly
  (sliding windows, scaled RoPE, an activation other than SiLU, Qwen3 attention/output biases, Qwen3-MoE with
  dense layers (``mlp_only_layers``, ``decoder_sparse_step`` > 1) or shared experts), is refused with
  ``UnsupportedModelError`` naming the value and the supported architectures.
- ``hf_config_dict(model_fields(c), arch)`` keeps every key of the table: mapping back and forth is the identity
  on the fields above.
- ``yield_to_checkpoint`` drops exactly the fields whose values differ from the checkpoint's, so the section it
  returns builds with ``hf_path`` without a conflict (tests/unit/test_hf_config.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from gyre_hpc.errors import UnsupportedModelError

SUPPORTED = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
ARCH_BY_NAME = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
MODEL_TYPE = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe"}
QWEN3 = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")  # q/k RMSNorm, head_dim, no biases
DEFAULT_ROPE_THETA = 10000.0


def read_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of the model directory ``path`` (missing or invalid: ``UnsupportedModelError``)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise UnsupportedModelError(f"{path}: not a Hugging Face model directory (no config.json)")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise UnsupportedModelError(f"{file}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise UnsupportedModelError(f"{file}: expected a JSON object")
    return data


def architecture(hf: Mapping[str, Any]) -> str:
    """The one supported architecture ``hf`` declares; anything else is refused by name."""
    archs = hf.get("architectures") or []
    if len(archs) != 1 or archs[0] not in SUPPORTED:
        raise UnsupportedModelError(f"architecture {archs or hf.get('model_type')!r} is not supported; "
                                    f"supported: {', '.join(SUPPORTED)}")
    return archs[0]


def rope_theta(hf: Mapping[str, Any]) -> float:
    """``rope_parameters["rope_theta"]`` (transformers 5), else ``rope_theta`` (transformers 4), else 10000."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise UnsupportedModelError(f"rope_type {rope_type!r} is not supported (only 'default' RoPE maps exactly)")
    return float(params.get("rope_theta", hf.get("rope_theta", DEFAULT_ROPE_THETA)))


def _refuse_variants(hf: Mapping[str, Any], arch: str) -> None:
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    if hf.get("use_sliding_window"):
        raise UnsupportedModelError("use_sliding_window: true is not supported (full attention only)")
    other = sorted({t for t in hf.get("layer_types") or () if t != "full_attention"})
    if other:
        raise UnsupportedModelError(f"layer_types {other} are not supported (full_attention only)")
    if arch in QWEN3 and hf.get("attention_bias"):
        raise UnsupportedModelError("Qwen3 attention_bias: true is not supported (o_proj bias has no megatron slot)")
    if arch == "Qwen3MoeForCausalLM":
        if hf.get("mlp_only_layers"):
            raise UnsupportedModelError(f"mlp_only_layers {hf['mlp_only_layers']} is not supported (every layer MoE)")
        if int(hf.get("decoder_sparse_step", 1)) != 1:
            raise UnsupportedModelError(f"decoder_sparse_step {hf['decoder_sparse_step']} is not supported (only 1)")
        if hf.get("shared_expert_intermediate_size"):
            raise UnsupportedModelError("shared experts are not supported (Qwen3-MoE has none)")
        if int(_experts(hf)) < 1:
            raise UnsupportedModelError("Qwen3MoeForCausalLM with num_experts 0 is not supported (use Qwen3)")


def _experts(hf: Mapping[str, Any]) -> int:
    """``num_experts``; transformers 5 saves it as ``num_local_experts`` (its attribute map)."""
    return int(hf.get("num_experts", hf.get("num_local_experts", 0)))


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields ``hf`` (a parsed config.json) describes (see the table above)."""
    arch = architecture(hf)
    _refuse_variants(hf, arch)
    theta = rope_theta(hf)
    if theta != int(theta):
        raise UnsupportedModelError(f"rope_theta {theta} is not an integer (model.rotary_base is)")
    heads = int(hf["num_attention_heads"])
    qwen3 = arch in QWEN3
    head_dim = hf.get("head_dim") if qwen3 else None
    moe = {}
    if arch == "Qwen3MoeForCausalLM":
        moe = {"experts": _experts(hf), "experts_topk": int(hf["num_experts_per_tok"]),
               "moe_ffn": int(hf["moe_intermediate_size"]), "norm_topk": bool(hf.get("norm_topk_prob", False))}
    return {
        "vocab_size": int(hf["vocab_size"]),
        "hidden": int(hf["hidden_size"]),
        "layers": int(hf["num_hidden_layers"]),
        "heads": heads,
        "kv_heads": int(hf.get("num_key_value_heads") or heads),
        "ffn": int(hf["intermediate_size"]),
        "max_seq_len": int(hf["max_position_embeddings"]),
        "head_dim": int(head_dim) if head_dim is not None else None,
        "rotary_base": int(theta),
        "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "qk_layernorm": qwen3,
        "qkv_bias": not qwen3,
        "position_embedding": "mrope",
        "normalization": "RMSNorm",
        "swiglu": True,
        **moe,
    }


def hf_config_dict(fields: Mapping[str, Any], arch: str, **extra: Any) -> dict[str, Any]:
    """A minimal config.json for ``arch`` from ModelConfig ``fields`` (plus ``extra`` keys, e.g. token ids)."""
    if arch not in SUPPORTED:
        raise UnsupportedModelError(f"architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED)}")
    heads = fields["heads"]
    out = {
        "architectures": [arch],
        "model_type": MODEL_TYPE[arch],
        "vocab_size": fields["vocab_size"],
        "hidden_size": fields["hidden"],
        "num_hidden_layers": fields["layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": fields.get("kv_heads") or heads,
        "intermediate_size": fields["ffn"],
        "max_position_embeddings": fields["max_seq_len"],
        "rope_parameters": {"rope_theta": float(fields["rotary_base"]), "rope_type": "default"},
        "rms_norm_eps": fields["norm_eps"],
        "tie_word_embeddings": fields["tie_embeddings"],
        "hidden_act": "silu",
        "dtype": "float32",
    }
    if arch in QWEN3:
        out["head_dim"] = fields.get("head_dim") or fields["hidden"] // heads
        out["attention_bias"] = False
    if arch == "Qwen3MoeForCausalLM":
        out.update(num_experts=fields["experts"], num_experts_per_tok=fields["experts_topk"],
                   moe_intermediate_size=fields["moe_ffn"], norm_topk_prob=fields["norm_topk"],
                   decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.0, output_router_logits=False)
    return {**out, **extra}


def resolve_fields(cfg: Any) -> dict[str, Any]:
    """The fields a ``ModelConfig`` with ``hf_path`` takes from its config.json (and ``hf_path`` made absolute).

    A field set to a value that is neither its default nor the checkpoint's is a ``ConfigError`` naming both."""
    import dataclasses

    from gyre_hpc.errors import ConfigError

    path = Path(cfg.hf_path).expanduser().resolve()
    try:
        fields = model_fields(read_config(path))
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"model.hf_path: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedModelError(f"model.hf_path: {path}/config.json lacks or mistypes {exc}") from None
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for key, value in fields.items():
        have = getattr(cfg, key)
        if have != defaults[key] and have != value:
            raise ConfigError(f"model.{key}: {have!r} conflicts with model.hf_path's config.json ({value!r}); "
                              f"leave it unset when model.hf_path is set")
    return {**fields, "hf_path": str(path)}


def yield_to_checkpoint(model: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A raw ``model`` config section (before it is built) whose ``hf_path`` names a readable checkpoint, less each
    architecture field whose value differs from that checkpoint's config.json (which then applies), and one
    ``"key: config V -> checkpoint W"`` note per field dropped. For commands that only serve a checkpoint (``gyre
    serve``): the config's model fields describe a model to build, and a served checkpoint is already built.
    Without ``hf_path``, or with one that cannot be read, ``model`` comes back unchanged (building it reports)."""
    out = dict(model)
    if not out.get("hf_path"):
        return out, []
    try:
        fields = model_fields(read_config(Path(str(out["hf_path"])).expanduser().resolve()))
    except (UnsupportedModelError, KeyError, TypeError, ValueError):
        return out, []
    notes = []
    for key, value in fields.items():
        if key in out and out[key] != value:
            notes.append(f"{key}: config {out.pop(key)!r} -> checkpoint {value!r}")
    return out, notes
