"""A sampled reply's text → an OpenAI assistant message: content, and tool calls in the Qwen format (pure).

The model writes tool calls as the chat template renders them::

    I will look.\\n<tool_call>\\n{"name": "bash", "arguments": {"cmd": "ls"}}\\n</tool_call><|im_end|>
    content "I will look."    tool_calls [{id, type: function, function: {name: bash, arguments: '{"cmd": "ls"}'}}]

Invariants (tests/unit/test_proxy_chat.py)
- Only the text is parsed; the sampled token ids are what TITO records (the caller never re-encodes this text).
- A ``<tool_call>`` block that is not a JSON object with a string ``name`` stays in the content as text; the
  content is the text before the first parsed block (one template newline removed), or None when empty.
- ``arguments`` is the JSON text of the sampled arguments object (``json.dumps``, the template's own spelling),
  so a client that sends the message back renders the same text.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class Reply:
    content: str | None
    tool_calls: tuple[dict, ...]

    def message(self) -> dict:
        msg: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [dict(c) for c in self.tool_calls]
        return msg


def _call(body: str) -> dict | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    return {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}


def parse_reply(text: str, call_prefix: str) -> Reply:
    """``text``: the decoded reply without its end-of-turn token; tool call ids are ``{call_prefix}_{i}``."""
    calls, first = [], None
    for m in BLOCK.finditer(text):
        fn = _call(m.group(1))
        if fn is None:
            continue
        first = m.start() if first is None else first
        calls.append({"id": f"{call_prefix}_{len(calls)}", "type": "function", "function": fn})
    content = text if first is None else text[:first]
    if first is not None and content.endswith("\n"):
        content = content[:-1]
    return Reply(content or None, tuple(calls))
