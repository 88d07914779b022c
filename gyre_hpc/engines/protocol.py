"""SGLang's HTTP protocol (0.5.23, token-in/token-out): request validation and response shapes, pure Python.

Both sides use this module: the local engine validates what it receives and builds what it answers with it; the
client parses answers with it, from the local engine or from a real SGLang server alike.

Invariants
- A request is either fully valid or rejected with ``EngineRequestError`` (HTTP 400) naming the offending key
  (``sampling_params.top_p``); an unknown key is rejected with the list of valid keys, as SGLang does.
- SGLang keys this engine does not implement are accepted only at SGLang's default value (a client that sends
  ``frequency_penalty: 0.0`` works; one that sends 0.5 gets a 400 instead of silently different sampling).
- ``version_spans`` partitions the output positions ``[0, n)``: consecutive spans touch (``end`` of one is
  ``start`` of the next, end exclusive), each names one weight version, and neighbours differ.
- ``GenerateResult.from_response`` accepts exactly what ``generate_response`` builds (round trip) and refuses a
  malformed answer with ``EngineError`` rather than returning a half-filled result.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from gyre_hpc.errors import EngineError


class EngineRequestError(EngineError):
    """A request that breaks the protocol: HTTP 400, ``key`` is the dotted offending key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}", status=400)
        self.key = key


# ------------------------------------------------------------------------------------------ sampling params
def _int(key: str, v: Any, lo: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise EngineRequestError(key, f"expected an integer, got {v!r}")
    if lo is not None and v < lo:
        raise EngineRequestError(key, f"must be >= {lo}, got {v}")
    return v


def _float(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise EngineRequestError(key, f"expected a finite number, got {v!r}")
    return float(v)


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise EngineRequestError(key, f"expected true or false, got {v!r}")
    return v


def _token_list(key: str, v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)):
        raise EngineRequestError(key, f"expected a list of token ids, got {v!r}")
    return tuple(_int(f"{key}[{i}]", t, 0) for i, t in enumerate(v))


@dataclass(frozen=True)
class SamplingParams:
    """The sampling parameters the local engine implements (SGLang names and defaults)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    sampling_seed: int | None = None


def _check_top_p(key: str, v: Any) -> float:
    p = _float(key, v)
    if not 0.0 < p <= 1.0:
        raise EngineRequestError(key, f"must be in (0, 1], got {p}")
    return p


def _check_top_k(key: str, v: Any) -> int:
    k = _int(key, v)
    if k != -1 and k < 1:
        raise EngineRequestError(key, f"must be -1 (all tokens) or >= 1, got {k}")
    return k


def _check_temperature(key: str, v: Any) -> float:
    t = _float(key, v)
    if t < 0:
        raise EngineRequestError(key, f"must be >= 0, got {t}")
    return t


_SAMPLING_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "max_new_tokens": lambda k, v: _int(k, v, 0),
    "temperature": _check_temperature,
    "top_p": _check_top_p,
    "top_k": _check_top_k,
    "min_new_tokens": lambda k, v: _int(k, v, 0),
    "stop_token_ids": _token_list,
    "ignore_eos": _bool,
    "sampling_seed": lambda k, v: None if v is None else _int(k, v),
}

#: SGLang sampling keys the local engine does not implement, with the values it accepts for each (SGLang's default).
SGLANG_DEFAULT_ONLY: dict[str, tuple] = {
    "stop": (None, [], ""), "stop_regex": (None, [], ""), "n": (1,), "min_p": (0.0,), "frequency_penalty": (0.0,),
    "presence_penalty": (0.0,), "repetition_penalty": (1.0,), "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,), "no_stop_trim": (False,), "json_schema": (None,), "regex": (None,),
    "ebnf": (None,), "structural_tag": (None,), "custom_params": (None,), "logit_bias": (None, {}),
    "stream_interval": (None,),
}


def _same(value: Any, accepted: tuple) -> bool:
    """``value`` equals one of ``accepted`` without mixing booleans and numbers (``True != 1`` here)."""
    return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in accepted)


def _default_only(key: str, value: Any, accepted: tuple) -> None:
    if not _same(value, accepted):
        raise EngineRequestError(key, f"{value!r} is not supported by the local engine (only SGLang's default "
                                 f"{accepted[0]!r})")


def parse_sampling_params(raw: Any, default_max_new_tokens: int = 128) -> SamplingParams:
    """Validate ``sampling_params``; unknown keys and unimplemented non-default values are a ``EngineRequestError``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise EngineRequestError("sampling_params", f"expected an object, got {raw!r}")
    values: dict[str, Any] = {"max_new_tokens": default_max_new_tokens}
    for key, value in raw.items():
        dotted = f"sampling_params.{key}"
        if key in _SAMPLING_CHECKS:
            if value is not None or key == "sampling_seed":
                values[key] = _SAMPLING_CHECKS[key](dotted, value)
        elif key in SGLANG_DEFAULT_ONLY:
            _default_only(dotted, value, SGLANG_DEFAULT_ONLY[key])
        else:
            valid = ", ".join([*_SAMPLING_CHECKS, *SGLANG_DEFAULT_ONLY])
            raise EngineRequestError(dotted, f"unknown sampling parameter; valid keys: {valid}")
    return SamplingParams(**values)


# ----------------------------------------------------------------------------------------- generate input
@dataclass(frozen=True)
class GenerateRequest:
    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams
    return_logprob: bool = False


#: top-level /generate keys accepted only at these values (no tokenizer, no streaming, no input logprobs).
_GENERATE_DEFAULT_ONLY: dict[str, tuple] = {
    "text": (None,), "stream": (False, None), "logprob_start_len": (-1, None), "top_logprobs_num": (0, None),
    "token_ids_logprob": (None,), "return_text_in_logprobs": (False, None), "lora_path": (None,),
    "image_data": (None,), "return_hidden_states": (False, None), "log_metrics": (True, False, None),
    "custom_logit_processor": (None,), "bootstrap_host": (None,), "bootstrap_room": (None,),
}
_GENERATE_KEYS = ("input_ids", "rid", "sampling_params", "return_logprob")


def parse_generate(body: Any, vocab_size: int, default_max_new_tokens: int = 128) -> GenerateRequest:
    """Validate a ``/generate`` body (one request, token ids in); a missing ``rid`` gets a fresh one."""
    if not isinstance(body, Mapping):
        raise EngineRequestError("body", f"expected a JSON object, got {type(body).__name__}")
    for key, value in body.items():
        if key in _GENERATE_DEFAULT_ONLY:
            _default_only(key, value, _GENERATE_DEFAULT_ONLY[key])
        elif key not in _GENERATE_KEYS:
            raise EngineRequestError(key, f"unknown key; valid keys: {', '.join([*_GENERATE_KEYS, *_GENERATE_DEFAULT_ONLY])}")
    ids = body.get("input_ids")
    if not isinstance(ids, (list, tuple)) or not ids or isinstance(ids[0], (list, tuple)):
        raise EngineRequestError("input_ids", "expected a non-empty list of token ids (one request, no batch)")
    input_ids = tuple(_int(f"input_ids[{i}]", t, 0) for i, t in enumerate(ids))
    bad = next((i for i, t in enumerate(input_ids) if t >= vocab_size), None)
    if bad is not None:
        raise EngineRequestError(f"input_ids[{bad}]", f"token {input_ids[bad]} is outside the vocabulary (size {vocab_size})")
    rid = body.get("rid")
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise EngineRequestError("rid", f"expected a non-empty string, got {rid!r}")
    return GenerateRequest(
        rid=rid or uuid.uuid4().hex,
        input_ids=input_ids,
        sampling=parse_sampling_params(body.get("sampling_params"), default_max_new_tokens),
        return_logprob=_bool("return_logprob", body.get("return_logprob", False) or False),
    )


# ------------------------------------------------------------------------------------------ control input
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")  # SGLang's GPU memory types (release/resume_memory_occupation)
PAUSE_MODES = ("abort", "retract", "in_place")


def parse_pause(body: Any) -> str:
    """``/pause_generation`` body → mode (default ``abort``, as SGLang)."""
    body = _object(body)
    _only(body, ("mode",))
    mode = body.get("mode", "abort")
    if mode not in PAUSE_MODES:
        raise EngineRequestError("mode", f"{mode!r} is not one of {', '.join(PAUSE_MODES)}")
    return mode


def parse_memory_tags(body: Any) -> tuple[str, ...]:
    """``/release_memory_occupation`` and ``/resume_memory_occupation`` body → the tags (none given: all)."""
    body = _object(body)
    _only(body, ("tags",))
    tags = body.get("tags")
    if tags is None:
        return MEMORY_TAGS
    if not isinstance(tags, list) or not all(t in MEMORY_TAGS for t in tags):
        raise EngineRequestError("tags", f"expected a list of {', '.join(MEMORY_TAGS)}, got {tags!r}")
    return tuple(dict.fromkeys(tags))


def parse_abort(body: Any) -> tuple[str | None, bool]:
    """``/abort_request`` body → (rid or None, abort_all)."""
    body = _object(body)
    _only(body, ("rid", "abort_all", "finished_reason", "abort_message"))
    rid = body.get("rid") or None
    if rid is not None and not isinstance(rid, str):
        raise EngineRequestError("rid", f"expected a string, got {rid!r}")
    return rid, _bool("abort_all", body.get("abort_all", False))


@dataclass(frozen=True)
class DiskUpdate:
    model_path: str
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True


def parse_update_from_disk(body: Any) -> DiskUpdate:
    body = _object(body)
    _only(body, ("model_path", "load_format", "weight_version", "abort_all_requests", "flush_cache", "is_async",
                 "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step", "manifest"))
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
        raise EngineRequestError("model_path", f"expected a directory path, got {path!r}")
    version = body.get("weight_version")
    if version is not None and (not isinstance(version, str) or not version):
        raise EngineRequestError("weight_version", f"expected a non-empty string, got {version!r}")
    return DiskUpdate(path, version, _bool("abort_all_requests", body.get("abort_all_requests", False)),
                      _bool("flush_cache", body.get("flush_cache", True)))


def parse_update_weight_version(body: Any) -> tuple[str, bool]:
    """``/update_weight_version`` body → (new_version, abort_all_requests); SGLang's default aborts."""
    body = _object(body)
    _only(body, ("new_version", "abort_all_requests"))
    version = body.get("new_version")
    if not isinstance(version, str) or not version:
        raise EngineRequestError("new_version", f"expected a non-empty string, got {version!r}")
    return version, _bool("abort_all_requests", body.get("abort_all_requests", True))


def _object(body: Any) -> Mapping:
    if body is None:
        return {}
    if not isinstance(body, Mapping):
        raise EngineRequestError("body", f"expected a JSON object, got {type(body).__name__}")
    return body


def _only(body: Mapping, keys: Sequence[str]) -> None:
    unknown = sorted(set(body) - set(keys))
    if unknown:
        raise EngineRequestError(unknown[0], f"unknown key; valid keys: {', '.join(keys)}")


# ---------------------------------------------------------------------------------------------- responses
def version_spans(versions: Sequence[str]) -> list[dict]:
    """Per-output-token weight versions → ``[{version, start, end}]`` (end exclusive), one span per run."""
    spans: list[dict] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans


def finish_length(n: int) -> dict:
    return {"type": "length", "length": n}


def finish_stop(matched: int) -> dict:
    return {"type": "stop", "matched": matched}


def finish_abort(message: str = "aborted") -> dict:
    return {"type": "abort", "message": message}


def generate_response(rid: str, prompt_tokens: int, output_ids: Sequence[int], logprobs: Sequence[float] | None,
                      versions: Sequence[str], current_version: str, finish: dict, e2e_latency: float,
                      cached_tokens: int = 0) -> dict:
    """The ``/generate`` answer, shaped as SGLang's (``text`` is empty: token ids in, token ids out)."""
    meta = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(output_ids),
        "cached_tokens": cached_tokens,
        "weight_version": versions[-1] if versions else current_version,
        "weight_versions": version_spans(versions),
        "e2e_latency": e2e_latency,
    }
    if logprobs is not None:
        meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(logprobs, output_ids)]
    return {"text": "", "output_ids": [int(t) for t in output_ids], "meta_info": meta}


def loads_response(running: int, waiting: int, max_running: int, used_tokens: int, max_tokens: int,
                   timestamp: str, version: str) -> dict:
    """``/v1/loads``: one data-parallel rank, with the aggregate the router's least-load policy reads."""
    load = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_total_reqs": running + waiting, "num_used_tokens": used_tokens, "max_total_num_tokens": max_tokens,
            "token_usage": used_tokens / max_tokens if max_tokens else 0.0, "max_running_requests": max_running}
    aggregate = {"total_running_reqs": running, "total_waiting_reqs": waiting, "total_reqs": running + waiting,
                 "total_used_tokens": used_tokens}
    return {"timestamp": timestamp, "version": version, "dp_rank_count": 1, "loads": [load], "aggregate": aggregate}


def error_body(message: str) -> dict:
    """SGLang's error answer for a refused request."""
    return {"error": {"message": message}}


# ------------------------------------------------------------------------------------------ client result
@dataclass(frozen=True)
class VersionSpan:
    version: str
    start: int
    end: int


@dataclass(frozen=True)
class GenerateResult:
    """A parsed ``/generate`` answer (from any SGLang-protocol engine)."""

    rid: str | None
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish_reason: str
    matched: int | str | None
    weight_version: str | None
    weight_versions: tuple[VersionSpan, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float | None
    meta_info: dict = field(repr=False, compare=False, default_factory=dict)

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"

    @classmethod
    def from_response(cls, body: Any) -> "GenerateResult":
        try:
            meta = body["meta_info"]
            output_ids = tuple(int(t) for t in body["output_ids"])
            finish = meta["finish_reason"] or {}
            raw_lp = meta.get("output_token_logprobs")
            logprobs = None if raw_lp is None else tuple(float(e[0]) for e in raw_lp)
            if logprobs is not None and [int(e[1]) for e in raw_lp] != list(output_ids):
                raise ValueError("output_token_logprobs token ids differ from output_ids")
            spans = tuple(VersionSpan(str(s["version"]), int(s["start"]), int(s["end"]))
                          for s in meta.get("weight_versions") or ())
            version = meta.get("weight_version")
            return cls(
                rid=meta.get("id"), output_ids=output_ids, logprobs=logprobs, finish_reason=str(finish["type"]),
                matched=finish.get("matched"), weight_version=None if version is None else str(version),
                weight_versions=spans, prompt_tokens=int(meta["prompt_tokens"]),
                completion_tokens=int(meta["completion_tokens"]), cached_tokens=int(meta.get("cached_tokens", 0)),
                e2e_latency=meta.get("e2e_latency"), meta_info=dict(meta),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise EngineError(f"malformed /generate answer ({exc!r}): {str(body)[:300]}", endpoint="/generate") from None
