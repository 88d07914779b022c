"""One harness call across engine requests ("segments"): the continuation after a move, and the merged answer.

How the run id and call id travel: the harness sends SGLang's ``/generate`` body with ``rid`` set to
``"<run_id>/<call_id>"`` (the run id may itself contain ``/``: the call id is after the last one) and, optionally,
a top-level ``query_id`` (default: the run id up to its first ``-``, as in ``q0-r1``). The proxy strips
``query_id`` and gives each engine request its own rid, so nothing gyre-specific reaches an engine (real SGLang
answers 400 to unknown ``sampling_params`` keys).

A call moved once (token diagram)::

    harness call      input [i0 i1 i2 i3]                      max_new_tokens 8
    segment 0  e0 v3  output [o0 o1 o2]          abort (e0 drains)
    continuation      input [i0 i1 i2 i3 o0 o1 o2]             max_new_tokens 8 - 3 = 5   (re-prefill)
    segment 1  e1 v4  output [o3 o4 o5 o6 o7]    length
    answer + TITO     input [i0 i1 i2 i3]  output [o0 .. o7]  versions [3 3 3 4 4 4 4 4]  engine "e0>e1"

Invariants (tests/unit/test_proxy_calls.py)
- A continuation's input is the call's original ``input_ids`` followed by every partial output so far, and its
  ``max_new_tokens`` (and ``min_new_tokens``, floored at 0) shrink by the partial length; every other sampling
  parameter is passed on unchanged. A call whose partial outputs already reach ``max_new_tokens`` needs none.
- A call is ONE answer and ONE TITO call however often it moved: output, logprobs and per-token weight versions
  are the segments' in order (each segment's version spans shifted by its offset); the finish reason is the last
  segment's; ``prompt_tokens`` is the original input length; ``engine`` names the engines in order (``e0>e1``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from gyre_hpc.engines.protocol import GenerateResult, generate_response
from gyre_hpc.proxy.routing import ProxyError
from gyre_hpc.trajectory.records import Call

#: top-level ``/generate`` keys the proxy accepts (``query_id`` is the proxy's own and is not forwarded).
BODY_KEYS = ("input_ids", "rid", "sampling_params", "return_logprob", "query_id", "stream")


@dataclass(frozen=True)
class CallRequest:
    rid: str
    run_id: str
    call_id: str
    query_id: str
    input_ids: tuple[int, ...]
    sampling: Mapping[str, Any]  # as the harness sent it, plus max_new_tokens
    return_logprob: bool

    @property
    def max_new_tokens(self) -> int:
        return int(self.sampling["max_new_tokens"])


@dataclass(frozen=True)
class CallSegment:
    """What one engine request produced: tokens, logprobs, one weight version per token, its finish reason."""

    engine: str
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[str, ...]
    finish: Mapping[str, Any]

    @property
    def aborted(self) -> bool:
        return self.finish.get("type") == "abort"

    @classmethod
    def of(cls, engine: str, res: GenerateResult) -> "CallSegment":
        if res.logprobs is None:
            raise ProxyError(f"engine {engine} answered without output_token_logprobs", 502)
        versions = [None] * len(res.output_ids)
        for span in res.weight_versions:
            versions[span.start:span.end] = [span.version] * (span.end - span.start)
        if None in versions:  # an engine that reports only the version of its last token
            if res.weight_version is None:
                raise ProxyError(f"engine {engine} answered without a weight version", 502)
            versions = [res.weight_version if v is None else v for v in versions]
        finish = dict(res.meta_info.get("finish_reason") or {"type": res.finish_reason})
        return cls(engine, res.output_ids, res.logprobs, tuple(versions), finish)


def _bad(key: str, message: str) -> ProxyError:
    return ProxyError(f"{key}: {message}", 400)


def split_rid(rid: Any) -> tuple[str, str]:
    """``"<run_id>/<call_id>"`` → (run_id, call_id); anything else is a 400 naming ``rid``."""
    if not isinstance(rid, str) or "/" not in rid:
        raise _bad("rid", f"expected '<run_id>/<call_id>', got {rid!r}")
    run_id, _, call_id = rid.rpartition("/")
    if not run_id or not call_id:
        raise _bad("rid", f"expected '<run_id>/<call_id>' with both parts non-empty, got {rid!r}")
    return run_id, call_id


def _count(sampling: Mapping, key: str) -> None:
    v = sampling.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise _bad(f"sampling_params.{key}", f"expected an integer >= 0, got {v!r}")


def parse_call(body: Any, default_max_new_tokens: int) -> CallRequest:
    """Validate the harness's ``/generate`` body; the engine validates the remaining sampling parameters."""
    if not isinstance(body, Mapping):
        raise _bad("body", f"expected a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(BODY_KEYS))
    if unknown:
        raise _bad(unknown[0], f"unknown key; valid keys: {', '.join(BODY_KEYS)}")
    if body.get("stream"):
        raise _bad("stream", "the proxy answers whole calls only (stream must be false)")
    run_id, call_id = split_rid(body.get("rid"))
    ids = body.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                       for t in ids):
        raise _bad("input_ids", "expected a non-empty list of token ids >= 0 (one request, no batch)")
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, Mapping):
        raise _bad("sampling_params", f"expected an object, got {sampling!r}")
    _count(sampling, "max_new_tokens")
    _count(sampling, "min_new_tokens")
    max_new = sampling.get("max_new_tokens")
    sampling = {**sampling, "max_new_tokens": default_max_new_tokens if max_new is None else max_new}
    query_id = body.get("query_id", run_id.split("-")[0])
    if not isinstance(query_id, str) or not query_id:
        raise _bad("query_id", f"expected a non-empty string, got {query_id!r}")
    logprob = body.get("return_logprob", False)
    if not isinstance(logprob, bool):
        raise _bad("return_logprob", f"expected true or false, got {logprob!r}")
    return CallRequest(body["rid"], run_id, call_id, query_id, tuple(ids), sampling, logprob)


def produced(segments: Sequence[CallSegment]) -> list[int]:
    return [t for s in segments for t in s.output_ids]


def continuation(req: CallRequest, segments: Sequence[CallSegment]) -> tuple[list[int], dict] | None:
    """The next engine request: (input_ids, sampling_params), or None when the output is already complete."""
    done = produced(segments)
    left = req.max_new_tokens - len(done)
    if segments and left <= 0:
        return None
    sampling = {**req.sampling, "max_new_tokens": max(left, 0)}
    if sampling.get("min_new_tokens"):
        sampling["min_new_tokens"] = max(int(sampling["min_new_tokens"]) - len(done), 0)
    return [*req.input_ids, *done], sampling


def finish_of(segments: Sequence[CallSegment], max_new_tokens: int) -> dict:
    if segments and not (segments[-1].aborted and len(produced(segments)) >= max_new_tokens):
        return dict(segments[-1].finish)
    return {"type": "length", "length": len(produced(segments))}


def engines_of(segments: Sequence[CallSegment]) -> str:
    names: list[str] = []
    for s in segments:
        if not names or names[-1] != s.engine:
            names.append(s.engine)
    return ">".join(names)


def answer(req: CallRequest, segments: Sequence[CallSegment], e2e_latency: float, moves: int) -> dict:
    """The harness's answer, in SGLang's shape, as if one engine had served the whole call."""
    out = produced(segments)
    logprobs = [lp for s in segments for lp in s.logprobs] if req.return_logprob else None
    versions = [v for s in segments for v in s.versions]
    last_version = versions[-1] if versions else ""
    body = generate_response(req.rid, len(req.input_ids), out, logprobs, versions, last_version,
                             finish_of(segments, req.max_new_tokens), e2e_latency)
    body["meta_info"]["proxy"] = {"engines": engines_of(segments), "moves": moves}
    return body


def _policy_version(engine: str, version: str) -> int:
    try:
        v = int(version)
    except ValueError:
        v = -1
    if v < 0:
        raise ProxyError(f"engine {engine} reported weight_version {version!r}; gyre records the policy version "
                         f"(optimizer step count) as a decimal string", 502)
    return v


def tito_call(req: CallRequest, segments: Sequence[CallSegment], t_start: float, t_end: float) -> Call:
    """The call's TITO record: ONE call, whatever number of segments served it."""
    versions = [_policy_version(s.engine, v) for s in segments for v in s.versions]
    return Call(req.run_id, req.query_id, req.call_id, np.asarray(req.input_ids, np.int64),
                np.asarray(produced(segments), np.int64), np.asarray([lp for s in segments for lp in s.logprobs],
                                                                     np.float64),
                np.asarray(versions, np.int64), engines_of(segments),
                str(finish_of(segments, req.max_new_tokens).get("type", "")), t_start, t_end)
