"""The proxy's OpenAI endpoint: overhead per chat call, prompt tokens reused exactly, chat calls/s at 64 runs.

Setup: a tiny ``gyre model init`` Qwen3 tokenizer and chat template; ``ScriptedEngineDouble`` (answers every
``/generate`` at once with a 32-token tool call), the proxy app under uvicorn; all in this process (threads), so
the numbers are the proxy's own CPU cost on this machine, not model time.

- overhead: the median latency of one chat call (turn 10 of a tool-using conversation, through the ``openai``
  client) against one ``/generate`` of the same prompt ids straight to the engine double (httpx), same run;
- reuse: reused_tokens / prompt_tokens of the chat book over 20-turn conversations (tokens taken verbatim from
  earlier calls' prompt + sampled output);
- throughput: 64 concurrent runs (threads), 10 turns each: chat calls per second.

    python benchmarks/bench_openai_proxy.py --repeats 7
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gyre_hpc.config import OpenAIConfig, ProxyConfig  # noqa: E402
from gyre_hpc.models.init import init_model  # noqa: E402
from gyre_hpc.proxy.hf_template import HFChatTemplate  # noqa: E402
from gyre_hpc.proxy.server import ProxyServer  # noqa: E402
from gyre_hpc.proxy.service import ProxyService  # noqa: E402
from tests.integration.openai_doubles import ScriptedEngineDouble, ThreadServer  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}}}}]
REPLY = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "pytest -x -q tests"}}\n</tool_call>'


def conversation(c: openai.OpenAI, turns: int, timed_turn: int | None = None) -> float:
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix the test."}]
    took = 0.0
    for turn in range(turns):
        t0 = time.perf_counter()
        msg = c.chat.completions.create(model="gyre-policy", messages=messages, tools=TOOLS).choices[0].message
        if turn == timed_turn:
            took = time.perf_counter() - t0
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "1 failed, 3 passed\n" * 5})
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--runs", type=int, default=64)
    ap.add_argument("--turns", type=int, default=10)
    args = ap.parse_args()
    model = init_model("qwen3", Path(tempfile.mkdtemp(prefix="bench-openai-")) / "tiny", vocab=1024)
    template = HFChatTemplate(model)
    out = template.encode(REPLY) + [template.stop_ids[0]]
    engine = ScriptedEngineDouble(lambda i, ids, run: out)
    service = ProxyService(ProxyConfig(openai=OpenAIConfig(tokenizer=str(model)), default_max_new_tokens=64))
    service.add_engine(engine.url, 0)
    proxy = ThreadServer(ProxyServer(service).app)
    result: dict = {}
    try:
        chat, direct = [], []
        with httpx.Client(base_url=engine.url, timeout=60) as http:
            for r in range(args.repeats):
                run = f"q{r}-overhead"
                chat.append(conversation(openai.OpenAI(base_url=f"{proxy.url}/runs/{run}/v1", api_key="k"),
                                         11, timed_turn=10))
                ids = engine.seen[-1]["input_ids"]
                t0 = time.perf_counter()
                http.post("/generate", json={"rid": f"direct{r}", "input_ids": ids, "return_logprob": True,
                                             "sampling_params": {"max_new_tokens": 64}}).raise_for_status()
                direct.append(time.perf_counter() - t0)
        result["chat_ms"] = 1e3 * statistics.median(chat)
        result["direct_ms"] = 1e3 * statistics.median(direct)
        result["prompt_tokens_turn10"] = len(engine.seen[-2]["input_ids"])
        before = httpx.get(f"{proxy.url}/admin/openai").json()["chat"]
        for r in range(3):
            conversation(openai.OpenAI(base_url=f"{proxy.url}/runs/q{r}-reuse/v1", api_key="k"), 20)
        after = httpx.get(f"{proxy.url}/admin/openai").json()["chat"]
        result["reused_share_20_turns"] = (after["reused_tokens"] - before["reused_tokens"]) / (
            after["prompt_tokens"] - before["prompt_tokens"])
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.runs) as pool:
            list(pool.map(lambda r: conversation(openai.OpenAI(base_url=f"{proxy.url}/runs/q{r}-load/v1",
                                                               api_key="k"), args.turns), range(args.runs)))
        result["calls_per_s"] = args.runs * args.turns / (time.perf_counter() - t0)
        result["runs"], result["turns"] = args.runs, args.turns
    finally:
        proxy.stop()
        engine.stop()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
