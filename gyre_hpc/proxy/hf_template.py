"""The model's tokenizer and chat template, from its Hugging Face directory (edge: imports transformers).

``HFChatTemplate(path)`` is the ``chat.ChatTemplate`` the proxy's OpenAI endpoint uses: ``render`` is the
tokenizer's ``apply_chat_template`` (text, not ids), ``encode`` never adds special tokens of its own (the template
writes them), ``decode`` keeps special tokens (the reply parser sees ``<tool_call>`` as written). The stop ids are
the end-of-turn token (``eos_token``), then ``<|endoftext|>`` when the vocabulary has it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from gyre_hpc.errors import ConfigError


class HFChatTemplate:
    def __init__(self, path: str | Path):
        from transformers import AutoTokenizer

        path = Path(path)
        if not path.is_dir():
            raise ConfigError(f"proxy.openai.tokenizer: {path} is not a directory with tokenizer files")
        self.tok = AutoTokenizer.from_pretrained(str(path))
        if not self.tok.chat_template:
            raise ConfigError(f"proxy.openai.tokenizer: {path} has no chat template (tokenizer_config.json)")
        if self.tok.eos_token is None:
            raise ConfigError(f"proxy.openai.tokenizer: {path} has no eos_token (the end-of-turn token)")
        self.eos_text = self.tok.eos_token
        stops = [self.tok.eos_token_id]
        other = self.tok.convert_tokens_to_ids("<|endoftext|>")
        if isinstance(other, int) and other != self.tok.unk_token_id and other not in stops:
            stops.append(other)
        self.stop_ids = tuple(stops)

    def render(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None, add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(list(messages), tools=list(tools) if tools else None, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False)) if text else []

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)
