"""The proxy's OpenAI endpoint through the unmodified ``openai`` client (2.8.0), token-exact TITO, history edits.

The proxy app runs in-process under uvicorn (real HTTP); the model's tokenizer and chat template are those of a
tiny ``gyre model init`` Qwen3 directory; the engine is ``ScriptedEngineDouble`` (replies with well-formed tool
calls, which a random tiny model would not write). The TITO file the proxy flushes is read back with
``read_tito`` and its branches classified by the trajectory processor.
"""
import json

import httpx
import openai
import pytest

from gyre_hpc.config import EngineConfig, ModelConfig, OpenAIConfig, ProxyConfig
from gyre_hpc.engines.launch import start_local_engine
from gyre_hpc.models.init import init_model
from gyre_hpc.proxy.hf_template import HFChatTemplate
from gyre_hpc.proxy.server import ProxyServer
from gyre_hpc.proxy.service import ProxyService
from gyre_hpc.trajectory.branches import BranchKind, classify
from gyre_hpc.trajectory.records import read_tito
from gyre_hpc.trajectory.tree import build_tree
from tests.integration.openai_doubles import ScriptedEngineDouble, ThreadServer

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a shell command",
                                           "parameters": {"type": "object",
                                                          "properties": {"cmd": {"type": "string"}}}}}]
MAX_TOOL_CHARS = 2000


def reply_text(i: int) -> str:
    if i % 7 == 6:  # now and then a reply without a tool call
        return f"Thinking about step {i}."
    spelling = '{"cmd":"echo %d"}' if i % 5 == 4 else '{"cmd": "echo %d"}'  # a compact one drifts from the template
    return f'Step {i}.\n<tool_call>\n{{"name": "bash", "arguments": {spelling % i}}}\n</tool_call>'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return init_model("qwen3", tmp_path_factory.mktemp("model") / "tiny", vocab=1024)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny):
    tmp = tmp_path_factory.mktemp("openai")
    model = tiny
    template = HFChatTemplate(model)
    end = template.stop_ids[0]
    engine = ScriptedEngineDouble(lambda i, ids, run: template.encode(reply_text(i)) + [end])
    cfg = ProxyConfig(openai=OpenAIConfig(tokenizer=str(model), max_tool_output_chars=MAX_TOOL_CHARS),
                      tito_dir=str(tmp))
    service = ProxyService(cfg)
    service.add_engine(engine.url, 0)
    proxy = ThreadServer(ProxyServer(service).app)
    try:
        yield proxy.url, engine, template, tmp
    finally:
        proxy.stop()
        engine.stop()


def client(url: str, run: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/runs/{run}/v1", api_key="gyre-placeholder", max_retries=0)


def flush(url: str, path, run: str):
    """Post the run's outcome and flush it into ``path`` (a file of the proxy's ``tito_dir``)."""
    with httpx.Client(base_url=url) as http:
        http.post("/tito/outcome", json={"run_id": run, "status": "scored", "score": 0.0}).raise_for_status()
        http.post("/admin/flush_tito", json={"name": path.name, "run_ids": [run]}).raise_for_status()
    return read_tito(path).runs[run]


def streamed(c: openai.OpenAI, **kw) -> dict:
    """The assistant message assembled from a streamed answer, as a streaming harness does."""
    content, calls = "", {}
    for chunk in c.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": tc.id, "type": "function",
                                               "function": {"name": "", "arguments": ""}})
            slot["function"]["name"] += tc.function.name or ""
            slot["function"]["arguments"] += tc.function.arguments or ""
    msg = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


def converse(c: openai.OpenAI, messages: list, turns: int) -> list:
    """``turns`` calls; tool calls get a tool answer, plain replies a user nudge. Re-serialises like clients do."""
    for turn in range(turns):
        kw = dict(model="gyre-policy", messages=messages, tools=TOOLS, max_tokens=200)
        if turn % 4 == 3:
            msg = streamed(c, **kw)
        else:
            msg = c.chat.completions.create(**kw).choices[0].message.model_dump(exclude_none=True)
            msg = dict(reversed(list(msg.items())))  # another key order, nulls dropped
        messages.append(msg)
        for tc in msg.get("tool_calls") or []:
            args = json.loads(tc["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": f"ran {args['cmd']}\nok"})
        if not msg.get("tool_calls"):
            messages.append({"role": "user", "content": "Go on."})
    return messages


def assert_extends(calls) -> None:
    for prev, call in zip(calls, calls[1:]):
        head = [*prev.input_ids.tolist(), *prev.output_ids.tolist()]
        assert call.input_ids[:len(head)].tolist() == head, call.call_id


def test_twenty_turn_tool_conversation_reuses_every_sampled_token(stack):
    url, engine, template, tmp = stack
    start = len(engine.seen)
    messages = converse(client(url, "q1-r0"), [{"role": "system", "content": "You fix bugs."},
                                               {"role": "user", "content": "Fix the failing test."}], 20)
    calls = flush(url, tmp / "conv.jsonl", "q1-r0")
    assert len(calls) == 20
    assert [c.input_ids.tolist() for c in calls] == [b["input_ids"] for b in engine.seen[start:]]
    assert_extends(calls)
    tree = build_tree(calls)
    assert [b.kind for b in classify(tree, calls)] == [BranchKind.ROOT] + [BranchKind.CONTINUATION] * 19
    assert sum(m.get("role") == "assistant" for m in messages) == 20
    stats = httpx.get(f"{url}/admin/openai").json()["chat"]
    assert stats["drift"] >= 1  # the compact tool-call spellings: still continued with the sampled tokens
    events = [e for e in httpx.get(f"{url}/admin/events").json()["events"] if e.get("run_id") == "q1-r0"]
    assert [e["event"] for e in events].count("chat_branch") == 1  # the first call only
    assert {e["call_id"] for e in events if e["event"] == "chat_drift"} == {calls[i + 1].call_id for i in (4, 9, 14)}


def test_history_edits_are_recorded_as_branches_of_their_kind(stack):
    url, engine, template, tmp = stack
    c = client(url, "q2-r0")
    system, task = {"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix it."}
    messages = converse(c, [system, task], 3)
    kw = dict(model="gyre-policy", tools=TOOLS, max_tokens=200)
    # mini-swe-agent on a format error: the last reply is dropped, an error message takes its place
    c.chat.completions.create(messages=messages[:-2] + [{"role": "user", "content": "Format error."}], **kw)
    # an edited tool output (a harness that rewrites a long observation)
    edited = [dict(m) for m in messages]
    edited[3]["content"] = "ran echo 0 (output elided)"
    c.chat.completions.create(messages=edited[:4], **kw)
    # compaction: everything after the system prompt replaced by a summary, then the run goes on from it
    converse(c, [system, {"role": "user", "content": "Summary: steps 0-2 done."}], 2)
    calls = flush(url, tmp / "edits.jsonl", "q2-r0")
    kinds = [b.kind for b in classify(build_tree(calls), calls)]
    assert kinds == [BranchKind.ROOT, BranchKind.CONTINUATION, BranchKind.CONTINUATION, BranchKind.RETRY,
                     BranchKind.RETRY, BranchKind.COMPRESSION, BranchKind.CONTINUATION]
    assert_extends(calls[:3])
    assert_extends(calls[5:])


def test_malformed_requests_get_openai_400s_naming_the_key(stack):
    url, _, _, _ = stack
    c = client(url, "q3-r0")
    cases = [(dict(messages=[{"content": "no role"}]), "messages[0].role"),
             (dict(messages=[]), "messages"),
             (dict(messages=[{"role": "user", "content": "hi"}], n=2), "n"),
             (dict(messages=[{"role": "user", "content": "hi"}], extra_body={"best_of": 3}), "best_of"),
             (dict(messages=[{"role": "user", "content": "hi"}], max_tokens=0), "max_tokens"),
             (dict(messages=[{"role": "user", "content": "hi"}], tool_choice="required"), "tool_choice"),
             (dict(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content[0]")]
    for kw, key in cases:
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model="gyre-policy", **kw)
        assert err.value.status_code == 400
        assert err.value.body["message"].startswith(f"{key}:") and err.value.body["type"] == "invalid_request_error"
    answer = httpx.post(f"{url}/runs/q3-r0/v1/chat/completions", content=b"{not json")
    assert answer.status_code == 400 and "message" in answer.json()["error"]


def test_a_huge_tool_output_is_cut_by_config_and_later_calls_still_extend(stack):
    url, engine, template, tmp = stack
    c = client(url, "q4-r0")
    messages = converse(c, [{"role": "user", "content": "Fix it."}], 1)
    messages[-1]["content"] = "x" * 1_000_000
    for _ in range(2):
        msg = c.chat.completions.create(model="gyre-policy", messages=messages, tools=TOOLS).choices[0].message
        messages += [msg.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    calls = flush(url, tmp / "huge.jsonl", "q4-r0")
    added = template.decode(calls[1].input_ids[len(calls[0].sequence):].tolist())
    assert "<tool_response>\n" + "x" * MAX_TOOL_CHARS + "\n[... 998000 characters cut by the proxy" in added
    assert_extends(calls)


def test_the_run_id_can_come_in_a_header_and_models_are_listed(stack):
    url, _, _, tmp = stack
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="k", default_headers={"X-Gyre-Run-Id": "q5-r0"}, max_retries=0)
    assert [m.id for m in c.models.list().data] == ["gyre-policy"]
    answer = c.chat.completions.create(model="gyre-policy", messages=[{"role": "user", "content": "hi"}], tools=TOOLS)
    assert answer.choices[0].finish_reason == "tool_calls"
    assert answer.choices[0].message.tool_calls[0].function.name == "bash"
    text = c.completions.create(model="gyre-policy", prompt="def f():", max_tokens=5)
    assert text.usage.completion_tokens == 5 and text.choices[0].finish_reason == "length"
    assert len(flush(url, tmp / "header.jsonl", "q5-r0")) == 2
    sub = client(url, "q5-r0/sub0").chat.completions.create(model="gyre-policy", messages=[{"role": "user",
                                                                                            "content": "hi"}])
    assert sub.gyre["run_id"] == "q5-r0/sub0"


@pytest.mark.megatron
def test_a_local_engine_serving_the_tiny_model_gets_prompts_that_extend_its_samples(tiny, tmp_path):
    """The real engine (megatron GPTModel from model.hf_path): random text, but every call extends the last."""
    engine = start_local_engine(EngineConfig(max_running_requests=4, context_len=2048, request_timeout_s=300.0),
                                ModelConfig(hf_path=str(tiny)), log_path=tmp_path / "engine.log")
    service = ProxyService(ProxyConfig(openai=OpenAIConfig(tokenizer=str(tiny)), tito_dir=str(tmp_path)))
    service.add_engine(engine.url, 0)
    proxy = ThreadServer(ProxyServer(service).app)
    try:
        c = client(proxy.url, "q6-r0")
        messages = [{"role": "user", "content": "Fix the bug."}]
        for turn in range(3):
            kw = dict(model="gyre-policy", messages=messages, tools=TOOLS, max_tokens=12, temperature=0.0)
            msg = streamed(c, **kw) if turn == 2 else c.chat.completions.create(**kw).choices[0].message.model_dump()
            messages += [msg, {"role": "user", "content": f"Try again ({turn})."}]
        calls = flush(proxy.url, tmp_path / "tito.jsonl", "q6-r0")
    finally:
        proxy.stop()
        engine.stop()
    assert len(calls) == 3 and all(len(c.output_ids) for c in calls)
    assert_extends(calls)
