"""OpenAI-compatible routes on the proxy: chat completions (tools, streaming), completions, models.

Mounted by ``server.py`` (``OpenAIRoutes(service, cfg.openai).mount(app)``). The run's identity is in the path,
``/runs/{run_id}/v1/...`` (give a harness ``OPENAI_BASE_URL=http://PROXY/runs/RUN/v1``), or in the header
``X-Gyre-Run-Id`` on ``/v1/...``; ``X-Gyre-Query-Id`` optionally names the query (default: the run id up to its
first ``-``). Each chat call becomes one proxy call (``ProxyService.generate``: routing, moves, one TITO record)
whose input ids come from ``chat.ChatBook`` and whose output ids are the tokens sampled; the reply text is parsed
for Qwen tool calls (``replies.py``) and never encoded again. docs/proxy.md has the details.

Invariants (tests/integration/test_proxy_openai.py)
- Every refusal is OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}`` with the status of
  the ``ProxyError`` (400 for a malformed request, naming the offending key).
- A call is entered in the chat book exactly when it is recorded in TITO (its answer is complete); a failed or
  hung-up call leaves no trace in either.
- Streaming answers (``stream: true``) are emitted after the whole call is served (the proxy serves whole calls):
  a role chunk, the content, one chunk per tool call, the finish chunk, an optional usage chunk, ``[DONE]``.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from typing import Any, Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gyre_hpc.config import OpenAIConfig
from gyre_hpc.errors import GyreError
from gyre_hpc.proxy.chat import ChatBook, bad, message, messages_of
from gyre_hpc.proxy.replies import Reply, parse_reply
from gyre_hpc.proxy.routing import ProxyError
from gyre_hpc.proxy.service import ProxyService
from gyre_hpc.net.serving import DISCONNECT_POLL_S, read_json, require_run

RUN_HEADER, QUERY_HEADER = "x-gyre-run-id", "x-gyre-query-id"
CHAT_KEYS = {"model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens",
             "max_completion_tokens", "stream", "stream_options", "n", "stop", "seed", "user", "parallel_tool_calls",
             "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "metadata", "store"}
COMPLETION_KEYS = {"model", "prompt", "temperature", "top_p", "max_tokens", "stream", "n", "stop", "seed", "user",
                   "presence_penalty", "frequency_penalty", "logprobs", "echo"}
FINISH = {"stop": "stop", "length": "length", "abort": "stop"}


def openai_error(exc: Exception) -> JSONResponse:
    status = getattr(exc, "status", None) or 400
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": str(exc), "type": kind, "param": getattr(exc, "param", None),
                                   "code": None}}, status_code=status)


def _body(body: Any, keys: set[str]) -> Mapping:
    if not isinstance(body, Mapping):
        raise bad("body", f"expected a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - keys)
    if unknown:
        raise bad(unknown[0], f"not supported by the gyre proxy; supported keys: {', '.join(sorted(keys))}")
    if body.get("n", 1) != 1:
        raise bad("n", f"only n=1 is supported, got {body['n']!r}")
    if body.get("stop") not in (None, [], ""):
        raise bad("stop", "stop strings are not supported (the reply ends at the end-of-turn token)")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise bad(key, "only 0 is supported")
    return body


def _sampling(body: Mapping, stop_ids: tuple[int, ...]) -> dict:
    sp: dict[str, Any] = {"stop_token_ids": list(stop_ids)}
    max_new = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_new is not None:
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
            raise bad("max_tokens", f"expected an integer >= 1, got {max_new!r}")
        sp["max_new_tokens"] = max_new
    for key in ("temperature", "top_p"):
        v = body.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise bad(key, f"expected a number, got {v!r}")
            sp[key] = float(v)
    return sp


class OpenAIRoutes:
    def __init__(self, service: ProxyService, cfg: OpenAIConfig, template: Any = None):
        self.service, self.cfg = service, cfg
        self._template = template
        self._book: ChatBook | None = None
        self._seq = itertools.count()

    def mount(self, app: FastAPI) -> None:
        for prefix in ("/runs/{run_id:path}/v1", "/v1"):  # a run id may hold "/" (a subagent: q0-r1/sub0)
            app.add_api_route(f"{prefix}/chat/completions", self.chat, methods=["POST"])
            app.add_api_route(f"{prefix}/completions", self.completions, methods=["POST"])
            app.add_api_route(f"{prefix}/models", self.models, methods=["GET"])
        app.add_api_route("/admin/openai", self.stats, methods=["GET"])

    @property
    def book(self) -> ChatBook:
        if self._book is None:
            if self._template is None:
                if self.cfg.tokenizer is None:
                    raise ProxyError("the OpenAI endpoint needs proxy.openai.tokenizer (the model's HF directory)", 503)
                from gyre_hpc.proxy.hf_template import HFChatTemplate
                self._template = HFChatTemplate(self.cfg.tokenizer)
            self._book = ChatBook(self._template, self.cfg.max_tool_output_chars)
        return self._book

    # ------------------------------------------------------------------------------------------- routes
    async def models(self, request: Request, run_id: str | None = None):
        if run_id is not None:
            try:
                require_run(request, run_id, lambda m: ProxyError(f"run_id: {m}", 403))
            except ProxyError as exc:
                return openai_error(exc)
        return {"object": "list", "data": [{"id": self.cfg.model_name, "object": "model", "created": 0,
                                            "owned_by": "gyre"}]}

    async def stats(self):
        return {"chat": dict(self._book.counts) if self._book else {}}

    async def chat(self, request: Request, run_id: str | None = None):
        try:
            body = _body(await self._json(request), CHAT_KEYS)
            run, query = self._ids(request, run_id)
            book = self.book
            msgs = messages_of(body.get("messages"), self.cfg.max_tool_output_chars)
            tools = self._tools(body)
            plan = book.plan(run, msgs, tools)
            sampling = _sampling(body, book.template.stop_ids)
        except GyreError as exc:
            return openai_error(exc)
        call_id = f"oa{next(self._seq)}"

        async def serve() -> tuple[dict, Reply]:
            answer = await self._generate(run, query, call_id, list(plan.prompt_ids), sampling)
            out = answer["output_ids"]
            stop = bool(out) and out[-1] in book.template.stop_ids
            text = book.template.decode(out[:-1] if stop else out)
            parse = body.get("tool_choice") != "none"
            reply = parse_reply(text, f"call_{call_id}") if parse else Reply(text or None, ())
            book.record(run, plan, message(reply.message(), -1, self.cfg.max_tool_output_chars).key, out)
            if plan.drift or not plan.extends:  # what a TITO reader may want to know about this call
                self.service.events.write("chat_drift" if plan.drift else "chat_branch", run_id=run, call_id=call_id,
                                          reused_tokens=plan.reused, shared_messages=plan.shared_messages,
                                          prompt_tokens=len(plan.prompt_ids))
            return answer, reply

        result = await self._unless_hung_up(request, serve())
        if isinstance(result, Response):
            return result
        answer, reply = result
        meta = answer["meta_info"]
        finish = "tool_calls" if reply.tool_calls else FINISH.get(meta["finish_reason"].get("type"), "stop")
        usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                 "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}
        head = {"id": f"chatcmpl-{call_id}-{uuid.uuid4().hex[:8]}", "created": int(self.service.clock.wall()),
                "model": self.cfg.model_name}
        gyre = {"run_id": run, "call_id": call_id, "reused_tokens": plan.reused, "extends": plan.extends,
                "drift": plan.drift, "weight_version": meta.get("weight_version")}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_chunks(head, reply, finish, usage if include_usage else None),
                                     media_type="text/event-stream")
        return {**head, "object": "chat.completion", "usage": usage, "gyre": gyre,
                "choices": [{"index": 0, "message": reply.message(), "finish_reason": finish, "logprobs": None}]}

    async def completions(self, request: Request, run_id: str | None = None):
        try:
            body = _body(await self._json(request), COMPLETION_KEYS)
            run, query = self._ids(request, run_id)
            if body.get("stream"):
                raise bad("stream", "streaming is supported on chat completions only")
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in prompt):
                ids = prompt
            elif isinstance(prompt, str) and prompt:
                ids = self.book.template.encode(prompt)
            else:
                raise bad("prompt", "expected a non-empty string or a list of token ids")
            sampling = _sampling(body, self.book.template.stop_ids)
        except GyreError as exc:
            return openai_error(exc)
        call_id = f"oa{next(self._seq)}"
        result = await self._unless_hung_up(request, self._generate(run, query, call_id, list(ids), sampling))
        if isinstance(result, Response):
            return result
        meta = result["meta_info"]
        return {"id": f"cmpl-{call_id}-{uuid.uuid4().hex[:8]}", "object": "text_completion",
                "created": int(self.service.clock.wall()), "model": self.cfg.model_name,
                "choices": [{"index": 0, "text": self.book.template.decode(result["output_ids"]), "logprobs": None,
                             "finish_reason": FINISH.get(meta["finish_reason"].get("type"), "stop")}],
                "usage": {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                          "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}}

    # ------------------------------------------------------------------------------------------ helpers
    async def _json(self, request: Request) -> Any:
        return await read_json(request, lambda m: bad("body", m))

    @staticmethod
    def _ids(request: Request, run_id: str | None) -> tuple[str, str]:
        run = run_id or request.headers.get(RUN_HEADER)
        if not run:
            raise bad("run_id", f"name the run in the path (/runs/RUN/v1/...) or the {RUN_HEADER} header")
        require_run(request, run, lambda m: ProxyError(f"run_id: {m}", 403))  # a run key reaches its own run only
        return run, request.headers.get(QUERY_HEADER) or run.split("-")[0]

    @staticmethod
    def _tools(body: Mapping) -> list | None:
        choice = body.get("tool_choice")
        if choice not in (None, "auto", "none"):
            raise bad("tool_choice", f"only 'auto' and 'none' are supported, got {choice!r}")
        tools = body.get("tools")
        if tools is None:
            return None
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)
                                                  and isinstance(t["function"].get("name"), str) for t in tools):
            raise bad("tools", "expected a list of {type: function, function: {name, description, parameters}}")
        return tools

    async def _generate(self, run: str, query: str, call_id: str, ids: list[int], sampling: dict) -> dict:
        return await self.service.generate({"rid": f"{run}/{call_id}", "query_id": query, "input_ids": ids,
                                            "sampling_params": sampling, "return_logprob": True})

    @staticmethod
    async def _unless_hung_up(request: Request, coro) -> Any:
        """The call's result, an OpenAI error response, or 499 when the client hung up (the call is cancelled)."""
        task = asyncio.ensure_future(coro)
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                exc = task.exception()
                if isinstance(exc, GyreError):
                    return openai_error(exc)
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, GyreError):
                    await task
                return Response(status_code=499)


def _chunks(head: dict, reply: Reply, finish: str, usage: dict | None):
    def sse(choice_delta: dict, finish_reason: str | None = None, **extra: Any) -> str:
        chunk = {**head, "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": choice_delta, "finish_reason": finish_reason, "logprobs": None}],
                 **extra}
        return f"data: {json.dumps(chunk)}\n\n"

    yield sse({"role": "assistant", "content": ""})
    if reply.content:
        yield sse({"content": reply.content})
    for i, call in enumerate(reply.tool_calls):
        yield sse({"tool_calls": [{"index": i, **call}]})
    yield sse({}, finish)
    if usage is not None:
        yield f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"
