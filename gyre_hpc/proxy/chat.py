"""Chat messages → prompt token ids, token-exact across the calls of a run (pure; the template is injected).

A run's calls are kept as *nodes*: the messages of the call plus the reply the model gave (as message keys,
matched by content: role, text, tool-call names and parsed arguments; never raw JSON, ids or key order), the
token sequence ``prompt + output`` and, per message, where it ends in that sequence. A new call's prompt is::

    earlier node   [S Q | a1]                 prompt S Q,  output a1 (the tokens sampled, ending in <|im_end|>)
    new messages   S Q a1 t1                  extends the node's messages + reply
    new prompt     [S Q a1] + encode("\\n" + "<|im_start|>user\\n<tool_response>..t1..<|im_end|>\\n"
                                      + "<|im_start|>assistant\\n")
                   ^ reused token-exact      ^ the closing the template puts after the reply's <|im_end|>,
                                               then the rendered text of the new messages (the template's suffix)

The suffix is the text of the whole conversation rendered by the model's chat template after the text of the
shared messages; it is encoded in pieces at message boundaries (so every later call can cut there too).

When the messages do not extend a node (the harness rewrote history: a compaction, a truncation, an edited tool
output, a dropped last reply), the prompt reuses the node that shares the most leading messages, up to the end
of the last shared message, then the rendered rest. Its tokens then diverge from earlier calls inside the run's
prefix tree, and the trajectory processor names the branch from the tokens (``trajectory/branches.py``): a
dropped reply or an edited tool output is a RETRY, a summary replacing everything after the system prompt a
COMPRESSION, a truncation that keeps the task verbatim a RETRY.

Template drift: the first time a reply is extended, the template's rendering of that assistant turn is encoded
and compared with the tokens sampled. They differ when the client changed the reply, the model wrote a tool call
in another JSON spelling than the template writes back, or the template rewrites history (e.g. drops reasoning).
The prompt still carries the sampled tokens (what the policy produced is what it is trained on, and what it
conditions on next); the call is counted in ``drift`` and reported in its plan.

Invariants (tests/unit/test_proxy_chat.py)
- A call whose messages extend an earlier call's messages + reply gets a prompt that begins with that call's
  prompt ids then its output ids, whatever the JSON spelling of the messages.
- Sampled tokens are never re-tokenised: they are reused from the node, or (history rewritten) left out.
- The shared part of a prompt ends at a message boundary whose rendering is a prefix of the new rendering, so the
  rest is exactly the template's text for the rest of the conversation.
- Tool messages longer than ``max_tool_chars`` are cut the same way in every call (a later call still matches).
- Memory is bounded: a run keeps its ``MAX_NODES_PER_RUN`` latest calls, the book its ``MAX_RUNS`` most recently
  active runs; a call that extends only a forgotten call is planned from what is kept (a branch, not an error).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from gyre_hpc.proxy.routing import ProxyError

ROLES = ("system", "user", "assistant", "tool")
MAX_NODES_PER_RUN = 16  # a run's most recent calls a new call may reuse (memory: prompt + output ids each)
MAX_RUNS = 4096  # runs kept, least recently used first out (a run evicted restarts from its rendering)
CUT_MARK = "\n[... {n} characters cut by the proxy (proxy.openai.max_tool_output_chars)]"


class ChatTemplate(Protocol):
    """What the bookkeeping needs from a tokenizer (``hf_template.HFChatTemplate`` in the proxy)."""

    eos_text: str  # the end-of-turn token's text, e.g. "<|im_end|>"
    stop_ids: tuple[int, ...]  # token ids that end a reply (the first is the end-of-turn token)

    def render(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None, add_generation_prompt: bool) -> str:
        ...

    def encode(self, text: str) -> list[int]:
        ...

    def decode(self, ids: Sequence[int]) -> str:
        ...


def bad(param: str, message: str) -> ProxyError:
    err = ProxyError(f"{param}: {message}", 400)
    err.param = param
    return err


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"{where}.content[{i}]", "only text parts {type: text, text: ...} are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"{where}.content", f"expected a string or a list of text parts, got {type(content).__name__}")


def _args_key(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return args
    return json.dumps(args, sort_keys=True, ensure_ascii=False)


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls", "expected a list")
    out = []
    for i, tc in enumerate(calls):
        fn = tc.get("function") if isinstance(tc, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise bad(f"{where}.tool_calls[{i}]", "expected {type: function, function: {name, arguments}}")
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, Mapping)):
            raise bad(f"{where}.tool_calls[{i}].function.arguments", "expected a JSON string or an object")
        out.append({"id": str(tc.get("id") or f"call_{i}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


@dataclass(frozen=True)
class Message:
    """One message as the template gets it, and its key for matching across calls."""

    render: Mapping[str, Any]
    key: tuple


def message(raw: Any, i: int, max_tool_chars: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise bad(where, f"expected an object, got {type(raw).__name__}")
    role = raw.get("role")
    if role not in ROLES:
        raise bad(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {role!r}")
    text = _text(raw.get("content"), where)
    if role == "tool" and len(text) > max_tool_chars:
        text = text[:max_tool_chars] + CUT_MARK.format(n=len(text) - max_tool_chars)
    calls = _tool_calls(raw.get("tool_calls"), where) if role == "assistant" else []
    render: dict[str, Any] = {"role": role, "content": text}
    if calls:
        render["tool_calls"] = calls
    if role == "tool" and raw.get("tool_call_id") is not None:
        render["tool_call_id"] = str(raw["tool_call_id"])
    key = (role, text.strip(), tuple((c["function"]["name"], _args_key(c["function"]["arguments"])) for c in calls))
    return Message(render, key)


def messages_of(raw: Any, max_tool_chars: int) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "expected a non-empty list of messages")
    return [message(m, i, max_tool_chars) for i, m in enumerate(raw)]


def tools_key(tools: Sequence[Mapping] | None) -> str:
    return json.dumps(tools or [], sort_keys=True, ensure_ascii=False)


@dataclass(eq=False)
class Node:
    """One finished call: its messages' keys + the reply's key, and ``ends[i]``: (token offset, closing text)."""

    keys: tuple[tuple, ...]
    tools: str
    seq: tuple[int, ...]
    prompt_len: int
    ends: list[tuple[int, str | None] | None]  # None: no cut here; closing None: a reply not yet extended
    text: str  # the template's rendering of the prompt (its messages + the generation prompt)


@dataclass(frozen=True)
class PromptPlan:
    prompt_ids: tuple[int, ...]
    keys: tuple[tuple, ...]
    tools: str
    ends: tuple[tuple[int, str | None] | None, ...]
    reused: int  # leading tokens taken from an earlier call's sequence
    shared_messages: int
    extends: bool  # the messages extend an earlier call's messages + reply (a continuation)
    drift: bool  # that reply's template rendering, tokenised, differs from the tokens sampled
    text: str = ""  # the rendered prompt


@dataclass
class ChatBook:
    """Per-run nodes; ``plan`` a call's prompt, ``record`` what it produced."""

    template: ChatTemplate
    max_tool_chars: int
    runs: dict[str, list[Node]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"calls": 0, "extends": 0, "branches": 0, "fresh": 0,
                                                            "drift": 0,
                                                            "prompt_tokens": 0, "reused_tokens": 0})

    def plan(self, run_id: str, msgs: Sequence[Message], tools: Sequence[Mapping] | None) -> PromptPlan:
        t = self.template
        renders = [m.render for m in msgs]
        full = t.render(renders, tools, True)
        keys, tkey = tuple(m.key for m in msgs), tools_key(tools)
        best, k_best = None, 0
        for node in reversed(self.runs.get(run_id, [])):
            if node.tools == tkey:
                k = _common(node.keys, keys)
                if k > k_best:
                    best, k_best = node, k
        for k in range(k_best, 0, -1):
            end = best.ends[k - 1]
            shared_text = t.render(renders[:k], tools, False) if end is not None else ""
            if end is None or not full.startswith(shared_text):
                continue
            offset, closing = end
            drift = False
            if closing is None:  # best's reply, extended for the first time
                closing, drift = self._closing(best, shared_text)
                if closing is None:
                    continue
                best.ends[k - 1] = (offset, closing)
            extends = k == len(best.keys)
            ids, ends = self._pieces(renders, tools, full, k, shared_text, closing, offset)
            return self._count(PromptPlan((*best.seq[:offset], *ids), keys, tkey, (*best.ends[:k], *ends), offset, k,
                                    extends, drift and extends, full))
        ids, ends = self._pieces(renders, tools, full, 0, "", "", 0)
        return self._count(PromptPlan(tuple(ids), keys, tkey, tuple(ends), 0, 0, False, False, full))

    def record(self, run_id: str, plan: PromptPlan, reply_key: tuple, output_ids: Sequence[int]) -> None:
        seq = (*plan.prompt_ids, *output_ids)
        nodes = self.runs.pop(run_id, [])  # re-inserted last: the dict's order is least recently used first
        ends = [*plan.ends, (len(seq), None)]
        nodes.append(Node((*plan.keys, reply_key), plan.tools, seq, len(plan.prompt_ids), ends, plan.text))
        self.runs[run_id] = nodes[-MAX_NODES_PER_RUN:]
        while len(self.runs) > MAX_RUNS:
            del self.runs[next(iter(self.runs))]

    def forget(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

    def _count(self, plan: PromptPlan) -> PromptPlan:
        c = self.counts
        c["calls"] += 1
        c["extends" if plan.extends else "branches" if plan.reused else "fresh"] += 1
        c["drift"] += plan.drift
        c["prompt_tokens"] += len(plan.prompt_ids)
        c["reused_tokens"] += plan.reused
        return plan

    def _closing(self, node: Node, shared_text: str) -> tuple[str | None, bool]:
        """The text the template puts after the reply's last sampled token, and whether the reply drifted.

        Only a node's own reply has no closing yet, so ``shared_text`` renders the node's messages + its reply and
        ``node.text`` the prompt it was sampled from."""
        t = self.template
        before = node.text
        if not shared_text.startswith(before):
            return None, False  # the template does not render the reply after the prompt it was sampled from
        turn = shared_text[len(before):]
        out = node.seq[node.prompt_len:]
        at = turn.rfind(t.eos_text) if t.eos_text else -1
        body, close = (turn, "") if at < 0 else (turn[:at], turn[at:])
        if out and out[-1] in t.stop_ids:
            sampled = out[:-1]
            if out[-1] == t.stop_ids[0] and close.startswith(t.eos_text):
                close = close[len(t.eos_text):]
        else:
            sampled = out
        return close, tuple(t.encode(body)) != tuple(sampled)

    def _pieces(self, renders: list, tools, full: str, k: int, shared_text: str, closing: str, offset: int):
        """Encode ``closing + full[len(shared_text):]`` cut at each later message boundary the rendering allows."""
        t = self.template
        ids: list[int] = []
        ends: list[tuple[int, str] | None] = []
        at, pending = len(shared_text), closing
        for j in range(k + 1, len(renders) + 1):
            text = t.render(renders[:j], tools, False)
            if len(text) >= at and full.startswith(text):
                ids += t.encode(pending + full[at:len(text)])
                at, pending = len(text), ""
                ends.append((offset + len(ids), ""))
            else:
                ends.append(None)
        ids += t.encode(pending + full[at:])
        return ids, ends


def _common(a: Sequence, b: Sequence) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
