"""TEMPORARY fixture (issue 10): a tiny Hugging Face Qwen3 directory for the engine tests, until `gyre model init`
(built in parallel, part 1 of issue 10) lands; at merge, replace ``make_tiny_qwen3`` by that command's function.

The directory holds what SGLang's ``--model-path`` and ``transformers.AutoModelForCausalLM`` load as they are:
config.json, model.safetensors (float32, random weights from ``seed``), generation_config.json, and a ByteLevel BPE
tokenizer trained here with the ``tokenizers`` library (no hub download): exactly ``VOCAB`` tokens including
``<|endoftext|>`` ``<|im_start|>`` ``<|im_end|>``, with a ChatML chat template.
"""
from __future__ import annotations

from pathlib import Path

VOCAB = 1024
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _corpus(n: int = 2000) -> list[str]:
    """Deterministic code-like lines with enough variety for ``VOCAB`` - 259 BPE merges."""
    import random
    rng = random.Random(0)
    words = ["def", "return", "class", "import", "self", "for", "in", "if", "else", "print", "range", "test"]
    letters = "abcdefghijklmnopqrstuvwxyz_"
    lines = []
    for i in range(n):
        toks = [rng.choice(words) if rng.random() < 0.3
                else "".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(rng.randint(5, 15))]
        lines.append(" ".join(toks) + f" = {rng.randint(0, 999)}")
    return lines


def make_tiny_qwen3(out_dir: str | Path, seed: int = 0, context: int = 4096) -> Path:
    """Write a tiny Qwen3 (hidden 64, 2 layers, 4 heads / 2 kv heads of head_dim 16, vocab 1024) to ``out_dir``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=context,
                      tie_word_embeddings=False, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                      pad_token_id=ids["<|endoftext|>"], torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return out
