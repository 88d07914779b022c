"""The chat book (messages → token-exact prompts) and the reply parser, with a character-level ChatML double.

``CharChatML`` stands in for the model's tokenizer at its boundary: it renders ChatML the way the shipped template
does (default system prompt, consecutive tool messages in one user turn) and encodes one token per character,
except the specials (<|im_start|> = 1, <|im_end|> = 2, <|endoftext|> = 3) and the pair "ab" (= 4), so a model can
sample a spelling the encoder would not produce (a then b) and the test can tell whether it was kept.
"""
import json

from gyre_hpc.proxy.chat import ChatBook, messages_of
from gyre_hpc.proxy.replies import parse_reply

SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2, "<|endoftext|>": 3, "ab": 4}


class CharChatML:
    eos_text = "<|im_end|>"
    stop_ids = (2, 3)

    def render(self, messages, tools, add_generation_prompt):
        system = messages[0]["content"] if messages[0]["role"] == "system" else "Default."
        out = "<|im_start|>system\n" + system + ("\nTOOLS " + json.dumps(tools) if tools else "") + "<|im_end|>\n"
        for i, m in enumerate(messages):
            if m["role"] == "system" and i == 0:
                continue
            if m["role"] == "tool":
                first = i == 0 or messages[i - 1]["role"] != "tool"
                last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
                out += ("<|im_start|>user" if first else "") + "\n<tool_response>\n" + m["content"] + \
                    "\n</tool_response>" + ("<|im_end|>\n" if last else "")
                continue
            body = m["content"]
            for tc in m.get("tool_calls", []):
                body += '\n<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (
                    tc["function"]["name"], tc["function"]["arguments"])
            out += "<|im_start|>" + m["role"] + "\n" + body + "<|im_end|>\n"
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def encode(self, text):
        ids, i = [], 0
        while i < len(text):
            for word, tid in SPECIAL.items():
                if text.startswith(word, i):
                    ids.append(tid)
                    i += len(word)
                    break
            else:
                ids.append(ord(text[i]) + 10)
                i += 1
        return ids

    def decode(self, ids):
        names = {v: k for k, v in SPECIAL.items()}
        return "".join(names.get(t, chr(t - 10) if t >= 10 else "?") for t in ids)


T = CharChatML()
SYS, TASK = {"role": "system", "content": "S"}, {"role": "user", "content": "Q"}


def call(book, run, raw, output_text, stop=True):
    """Plan a call, 'sample' ``output_text`` (one id per character, so "ab" is a then b), record it."""
    msgs = messages_of(raw, book.max_tool_chars)
    plan = book.plan(run, msgs, None)
    out = [ord(c) + 10 for c in output_text] + ([2] if stop else [])
    reply = parse_reply(output_text, "c")
    book.record(run, plan, messages_of([reply.message()], book.max_tool_chars)[0].key, out)
    return plan, out, reply


def test_a_call_extending_the_last_begins_with_its_prompt_and_sampled_output():
    book = ChatBook(T, 100)
    p0, out0, _ = call(book, "r", [SYS, TASK], "grab it")  # "ab" sampled as a, b: not how encode spells it
    assert T.decode(p0.prompt_ids) == T.render([SYS, TASK], None, True)
    again = [{"content": "Q", "role": "user"}, {"content": "grab it", "role": "assistant", "tool_calls": None}]
    p1, _, _ = call(book, "r", [SYS, *again, {"role": "user", "content": "more"}], "ok")
    assert p1.prompt_ids[:len(p0.prompt_ids) + len(out0)] == (*p0.prompt_ids, *out0)
    assert p1.extends and p1.drift and p1.reused == len(p0.prompt_ids) + len(out0)
    rest = T.decode(p1.prompt_ids[p1.reused:])
    assert rest == "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"  # the closing, then the suffix


def test_a_reply_cut_by_length_is_closed_by_the_template_end_of_turn():
    book = ChatBook(T, 100)
    p0, out0, _ = call(book, "r", [SYS, TASK], "half", stop=False)
    p1, _, _ = call(book, "r", [SYS, TASK, {"role": "assistant", "content": "half"}, {"role": "user", "content": "x"}],
                    "y")
    assert p1.extends and not p1.drift
    assert T.decode(p1.prompt_ids[len(p0.prompt_ids) + len(out0):]).startswith("<|im_end|>\n<|im_start|>user")


def test_a_dropped_last_reply_reuses_the_prompt_up_to_its_last_message():
    book = ChatBook(T, 100)
    p0, out0, r0 = call(book, "r", [SYS, TASK], "one")
    history = [SYS, TASK, r0.message(), {"role": "user", "content": "u1"}]
    p1, out1, _ = call(book, "r", history, "two")
    p2, _, _ = call(book, "r", history + [{"role": "user", "content": "Format error."}], "three")
    assert not p2.extends and p2.shared_messages == 4
    generation_prompt = len(T.encode("<|im_start|>assistant\n"))
    assert p2.prompt_ids[:p2.reused] == p1.prompt_ids[:len(p1.prompt_ids) - generation_prompt]


def test_no_cut_inside_a_group_of_tool_messages():
    book = ChatBook(T, 100)
    _, _, r0 = call(book, "r", [SYS, TASK], "go")
    tools = [{"role": "tool", "content": "t1"}, {"role": "tool", "content": "t2"}]
    p1, _, _ = call(book, "r", [SYS, TASK, r0.message(), *tools], "next")
    assert p1.ends[3] is None and p1.ends[4] is not None  # t1's end is not a boundary of the rendering
    p2, _, _ = call(book, "r", [SYS, TASK, r0.message(), tools[0], {"role": "tool", "content": "t2 edited"}], "z")
    assert p2.shared_messages == 3 and T.decode(p2.prompt_ids) .endswith("t2 edited\n</tool_response><|im_end|>\n"
                                                                         "<|im_start|>assistant\n")


def test_a_long_tool_output_is_cut_the_same_way_in_every_call():
    book = ChatBook(T, 10)
    _, _, r0 = call(book, "r", [SYS, TASK], "go")
    msgs = [SYS, TASK, r0.message(), {"role": "tool", "content": "y" * 50}]
    p1, out1, r1 = call(book, "r", msgs, "done")
    p2, _, _ = call(book, "r", msgs + [r1.message(), {"role": "user", "content": "again"}], "ok")
    assert "y" * 10 + "\n[... 40 characters cut" in T.decode(p1.prompt_ids) and "y" * 11 not in T.decode(p1.prompt_ids)
    assert p2.extends and p2.prompt_ids[:len(p1.prompt_ids) + len(out1)] == (*p1.prompt_ids, *out1)


def test_runs_and_tool_lists_do_not_share_prompts():
    book = ChatBook(T, 100)
    call(book, "r1", [SYS, TASK], "a")
    assert book.plan("r2", messages_of([SYS, TASK], 100), None).reused == 0
    assert book.plan("r1", messages_of([SYS, TASK], 100), [{"type": "function", "function": {"name": "f"}}]).reused == 0


def test_tool_calls_are_parsed_from_the_text_in_the_qwen_format():
    text = 'Look.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>' \
           '\n<tool_call>\n{"name": "edit", "arguments": "{\\"p\\": 1}"}\n</tool_call>'
    r = parse_reply(text, "call_x")
    assert r.content == "Look."
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in r.tool_calls] == [
        ("call_x_0", "bash", '{"cmd": "ls"}'), ("call_x_1", "edit", '{"p": 1}')]
    broken = parse_reply("<tool_call>\nnot json\n</tool_call>", "c")
    assert broken.tool_calls == () and broken.content == "<tool_call>\nnot json\n</tool_call>"
    assert parse_reply('<tool_call>{"name": "f"}</tool_call>', "c").content is None


def test_memory_is_bounded_per_run_and_the_latest_call_still_extends(monkeypatch):
    import gyre_hpc.proxy.chat as chat
    monkeypatch.setattr(chat, "MAX_NODES_PER_RUN", 3)
    monkeypatch.setattr(chat, "MAX_RUNS", 2)
    book = ChatBook(T, 100)
    msgs = [SYS, TASK]
    for i in range(6):
        plan, out, reply = call(book, "r", msgs, f"reply {i}")
        assert i == 0 or plan.extends
        msgs = msgs + [reply.message(), {"role": "user", "content": f"u{i}"}]
    assert len(book.runs["r"]) == 3
    call(book, "other1", [SYS, TASK], "x")
    call(book, "other2", [SYS, TASK], "y")
    assert list(book.runs) == ["other1", "other2"]  # "r" was the least recently used
