"""``init_model``: a small real-format Qwen2/Qwen3/Qwen3-MoE directory with random weights and a locally trained tokenizer.

What it writes (loads with ``AutoTokenizer`` / ``AutoModelForCausalLM`` and SGLang's ``--model-path``)::

    config.json, model.safetensors     transformers' own model class and config, float32, random (seeded) weights
    generation_config.json             eos = [<|im_end|>, <|endoftext|>], pad = <|endoftext|>
    tokenizer.json, tokenizer_config.json, chat_template.jinja
                                       ByteLevel BPE trained on generated text (no download), exactly ``vocab``
                                       tokens: the trained ones, then <|endoftext|> <|im_start|> <|im_end|>
                                       (special) and <tool_call> </tool_call> <tool_response> </tool_response>
                                       (plain added tokens, kept by decoding); ChatML template with tools

Invariants
- Deterministic: the same arguments give byte-identical weight and tokenizer files.
- The tokenizer has exactly ``vocab`` tokens, equal to config.json's ``vocab_size``, and decodes what it encodes
  back to the same text (no normalizer; ByteLevel covers every byte).
- The directory appears whole or not at all (written to a temporary sibling, then renamed).
"""
from __future__ import annotations

import random
from pathlib import Path

from gyre_hpc.errors import ConfigError
from gyre_hpc.files.hf_config import ARCH_BY_NAME, MODEL_TYPE

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
#: Qwen2's pre-tokenizer split (contractions, words, single digits, punctuation runs, newlines, spaces)
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
MIN_VOCAB = 256 + len(SPECIAL) + len(TOOL_TOKENS) + 1
DEFAULTS = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 1024, "context": 4096, "seed": 0}


def corpus(seed: int, lines: int = 6000) -> list[str]:
    """Generated training text: words, code, JSON tool calls and chat turns (deterministic for ``seed``)."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "ru", "ta", "si", "po", "de", "fu", "an", "er", "in", "on", "th", "st"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 3))) for _ in range(400)]
    words += ["def", "return", "import", "class", "self", "print", "for", "in", "if", "else", "None", "True",
              "the", "a", "to", "of", "and", "is", "file", "test", "error", "fix", "python", "name", "arguments"]
    out = []
    for _ in range(lines):
        kind = rng.random()
        ws = [rng.choice(words) for _ in range(rng.randint(3, 12))]
        if kind < 0.4:
            out.append(" ".join(ws).capitalize() + rng.choice([".", "?", "!", ":"]))
        elif kind < 0.65:
            out.append(f"def {ws[0]}({', '.join(ws[1:3])}):\n    return {ws[3 % len(ws)]} + {rng.randint(0, 999)}")
        elif kind < 0.85:
            out.append(f'<tool_call>\n{{"name": "{ws[0]}", "arguments": {{"{ws[1]}": "{ws[2]}"}}}}\n</tool_call>')
        else:
            out.append(f"<|im_start|>user\n{' '.join(ws)}<|im_end|>\n<|im_start|>assistant\n{ws[0]}<|im_end|>")
    return out


def train_tokenizer(vocab: int, seed: int):
    """A ``tokenizers.Tokenizer`` with exactly ``vocab`` tokens (ByteLevel BPE + the special and tool tokens)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab < MIN_VOCAB:
        raise ConfigError(f"--vocab {vocab}: must be >= {MIN_VOCAB} (256 bytes + special and tool tokens + 1)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trained = vocab - len(SPECIAL) - len(TOOL_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=trained, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    if tok.get_vocab_size() != trained:
        raise ConfigError(f"--vocab {vocab}: the generated corpus supports only {tok.get_vocab_size()} BPE tokens")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok


def hf_config(arch: str, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, context: int,
              head_dim: int | None, ffn: int | None, tie: bool, ids: dict[str, int], rope_theta: float = 1e6,
              norm_eps: float = 1e-6, experts: int = 8, topk: int = 2, moe_ffn: int | None = None,
              norm_topk: bool = True):
    """transformers' config object for the model (float32; RoPE theta 1e6 and RMSNorm eps 1e-6 as Qwen's).
    Qwen3-MoE: ``experts`` routed experts of ``moe_ffn`` (default hidden) in every layer, ``topk`` per token, no
    auxiliary loss."""
    from transformers import AutoConfig

    kw = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
              num_key_value_heads=kv_heads, intermediate_size=ffn or 4 * hidden, max_position_embeddings=context,
              rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)}, rms_norm_eps=norm_eps,
              tie_word_embeddings=tie, hidden_act="silu", bos_token_id=ids["<|endoftext|>"],
              eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], dtype="float32")
    if arch == "Qwen3MoeForCausalLM":
        if not 1 <= topk <= experts:
            raise ConfigError(f"--topk {topk}: must be in [1, --experts={experts}]")
        kw.update(num_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=moe_ffn or hidden,
                  norm_topk_prob=norm_topk, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.0)
    if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        kw["head_dim"] = head_dim or hidden // heads
    elif head_dim not in (None, hidden // heads):
        raise ConfigError(f"--head-dim {head_dim}: Qwen2 has head_dim = hidden / heads = {hidden // heads}")
    cfg = AutoConfig.for_model(MODEL_TYPE[arch], **kw)
    cfg.architectures = [arch]
    return cfg


def init_model(arch: str, out: str | Path, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               vocab: int = 1024, context: int = 4096, seed: int = 0, head_dim: int | None = None,
               ffn: int | None = None, tie: bool = False, overwrite: bool = False, rope_theta: float = 1e6,
               norm_eps: float = 1e-6, experts: int = 8, topk: int = 2, moe_ffn: int | None = None,
               norm_topk: bool = True) -> Path:
    """Write a random ``arch`` ('qwen2' | 'qwen3' | 'qwen3_moe') model with a trained tokenizer to ``out``;
    returns ``out``. ``experts``, ``topk``, ``moe_ffn`` and ``norm_topk`` apply to qwen3_moe only."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    from gyre_hpc.files.io import atomic_dir
    from gyre_hpc.models.chat_template import CHAT_TEMPLATE

    if arch not in ARCH_BY_NAME:
        raise ConfigError(f"--arch {arch!r}: choose one of {', '.join(ARCH_BY_NAME)}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; choose another --out or pass --force to replace it")
    tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(vocab, seed), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE,
                                  model_max_length=context, clean_up_tokenization_spaces=False)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    cfg = hf_config(ARCH_BY_NAME[arch], vocab, hidden, layers, heads, kv_heads, context, head_dim, ffn, tie, ids,
                    rope_theta, norm_eps, experts, topk, moe_ffn, norm_topk)
    gen = GenerationConfig(bos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"],
                           eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]])
    hf_logging.disable_progress_bar()
    with atomic_dir(out) as tmp:
        tmp.chmod(0o755)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.save_pretrained(tmp)
        model.generation_config = gen
        gen.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        for f in tmp.iterdir():
            f.chmod(0o644)
    return out
