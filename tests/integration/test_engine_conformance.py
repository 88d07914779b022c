"""One protocol suite, two engines: the local engine (the CPU double) and a real SGLang 0.5.23 server.

Every test runs against both with the same assertions; where they differed, the local engine was changed to do
what SGLang does (docs/engines.md lists the deviations found). Each engine serves its own model (the local engine the
project's megatron model, vocab 256; SGLang a tiny Hugging Face Qwen3, vocab 1024), so the tests use token ids below
both vocabularies and assert on the protocol (shapes, finish reasons, versions, pause/abort semantics), never on
token values across engines.

One server at a time: the session fixture is parametrised, so pytest finishes every test of one engine, stops it by
PID, then starts the other. Nothing here is timed: waits poll the engine's ``/v1/loads`` until a request holds
tokens; a request that must be held is made long enough that it cannot finish during a pause round trip.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
import pytest
import torch

from gyre_hpc.net import auth
from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.client import EngineClient
from gyre_hpc.engines.launch import EngineHandle, on_free_port, start_engine
from gyre_hpc.engines.protocol import GenerateResult
from gyre_hpc.engines.weight_sync import WeightPusher
from gyre_hpc.engines.weight_tensor import TensorPusher, encode, serialize
from gyre_hpc.errors import EngineError

pytestmark = [pytest.mark.slow]

PROMPT = [5, 17, 42, 99, 3]  # below both vocabularies (256 and 1024)
LONG = 400  # a request that is aborted long before it ends
HELD = 200  # a request that is paused or relabelled mid-way, then runs to its end (long enough that a loaded
#            machine cannot finish it between "it runs" and the pause)


@dataclass
class Served:
    kind: str
    handle: EngineHandle
    client: EngineClient


def _start(kind: str, tmp) -> EngineHandle:
    if kind == "local":
        cfg = EngineConfig(max_running_requests=8, context_len=256, startup_timeout_s=300.0, request_timeout_s=300.0)
        return on_free_port(start_engine, cfg, ModelConfig(), log_path=tmp / "engine.log", name="conformance")
    from gyre_hpc.models.init import init_model

    model = init_model("qwen3", tmp / "qwen3-tiny", head_dim=16, ffn=128)
    cfg = EngineConfig(kind="sglang", model_path=str(model), max_running_requests=8, context_len=512,
                       startup_timeout_s=600.0, request_timeout_s=300.0)
    return on_free_port(start_engine, cfg, ModelConfig(), log_path=tmp / "engine.log", name="conformance")


@pytest.fixture(scope="module", params=[pytest.param("local", marks=[pytest.mark.engine, pytest.mark.megatron]),
                                         pytest.param("sglang", marks=pytest.mark.sglang)])
def served(request, tmp_path_factory):
    handle = _start(request.param, tmp_path_factory.mktemp(f"conformance-{request.param}"))
    client = handle.client(timeout=300.0)
    yield Served(request.param, handle, client)
    client.close()
    handle.stop(grace_s=30.0)
    assert not handle.alive()


@pytest.fixture
def client(served):
    """The engine's client; after each test the engine runs again and holds no request."""
    yield served.client
    served.client.resume()
    served.client.abort_all()
    _wait(lambda: served.client.loads().total == 0)


def _auth() -> dict:
    """The job secret both engines were started with (``children.child_env``; SGLang's ``api-key``)."""
    return auth.bearer(auth.job_secret())


def _load(client: EngineClient) -> dict:
    return httpx.get(client.url + "/v1/loads", headers=_auth(), timeout=30).json()["loads"][0]


def _wait(cond, timeout=300.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


class _Background:
    """A /generate call in a thread, so the test can pause, abort or relabel meanwhile."""

    def __init__(self, client: EngineClient, max_new_tokens: int, rid: str | None = None):
        self.result: GenerateResult | None = None
        self.error: Exception | None = None
        params = {"max_new_tokens": max_new_tokens, "ignore_eos": True}
        self.thread = threading.Thread(target=self._run, args=(client, params, rid))
        self.thread.start()

    def _run(self, client, params, rid):
        try:
            self.result = client.generate(PROMPT, params, rid=rid)
        except Exception as exc:  # handed to the test thread
            self.error = exc

    def held(self) -> bool:
        self.thread.join(0.5)
        return self.thread.is_alive()

    def join(self, timeout=300.0) -> GenerateResult:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "generate did not return"
        if self.error:
            raise self.error
        return self.result


def _decoding(client: EngineClient, max_new_tokens: int, rid: str | None = None, timeout: float = 300.0) -> _Background:
    """Start a request and return once it runs and has produced at least two tokens. A request that ended before
    /v1/loads showed it running (a poll starved on a loaded machine) is started once more, then the test fails
    with how it ended, instead of waiting out the timeout for a request that is gone."""
    seen: list[dict] = []

    def running() -> bool:
        seen[:] = [_load(client)]
        return seen[0]["num_running_reqs"] >= 1 and seen[0]["num_used_tokens"] >= len(PROMPT) + 2

    for _ in range(2):
        bg = _Background(client, max_new_tokens, rid)
        _wait(lambda: running() or not bg.thread.is_alive(), timeout)
        if bg.thread.is_alive():
            return bg
    how = bg.error or (bg.result.finish_reason, len(bg.result.output_ids))
    raise AssertionError(f"the request ended before it was seen running, twice: {how!r}; last load {seen}")


def _spans(res: GenerateResult) -> list[tuple[str, int, int]]:
    return [(s.version, s.start, s.end) for s in res.weight_versions]


def _assert_updated_under_a_held_request(client, stats, n_tensors, res, old, new, before, greedy) -> None:
    """A push that landed at once while a request decoded: the request ran to its end (never aborted) with its
    version spans split at the update, the engine reports ``new``, and greedy output changed."""
    assert stats["attempt"] == 0 and stats["tensors"] == n_tensors
    assert res.finish_reason == "length" and len(res.output_ids) == HELD  # never aborted
    spans = _spans(res)
    assert len(spans) == 2 and spans[0][:2] == (old, 0) and spans[1][0] == new and spans[1][2] == HELD
    assert spans[0][2] == spans[1][1]
    assert client.weight_version() == new == client.model_info()["weight_version"]
    assert client.generate(PROMPT, greedy).output_ids != before


# ------------------------------------------------------------------------------------------------- generate
def test_generate_returns_the_requested_tokens_logprobs_and_one_version_span(client):
    version = client.weight_version()
    res = client.generate(PROMPT, {"max_new_tokens": 7, "temperature": 0.8, "top_p": 0.9, "top_k": 20,
                                   "sampling_seed": 3, "ignore_eos": True}, rid="conf-gen")
    assert res.rid == "conf-gen" and res.finish_reason == "length"
    assert len(res.output_ids) == 7 == res.completion_tokens and res.prompt_tokens == len(PROMPT)
    assert len(res.logprobs) == 7 and all(lp <= 0.0 for lp in res.logprobs)
    assert [e[1] for e in res.meta_info["output_token_logprobs"]] == list(res.output_ids)
    assert res.weight_version == version and _spans(res) == [(version, 0, 7)]


def test_without_return_logprob_no_logprobs_come_back(client):
    res = client.generate(PROMPT, {"max_new_tokens": 3, "ignore_eos": True}, return_logprob=False)
    assert len(res.output_ids) == 3 and res.logprobs is None


def test_a_stop_token_ends_the_request_as_its_last_output_token(client):
    greedy = {"max_new_tokens": 8, "temperature": 0.0}
    free = client.generate(PROMPT, greedy)
    stop = free.output_ids[1]
    res = client.generate(PROMPT, {**greedy, "stop_token_ids": [stop]})
    assert res.finish_reason == "stop" and res.matched == stop
    assert res.output_ids == free.output_ids[: free.output_ids.index(stop) + 1]


def test_ignore_eos_also_ignores_stop_token_ids(client):
    free = client.generate(PROMPT, {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True})
    res = client.generate(PROMPT, {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True,
                                   "stop_token_ids": [free.output_ids[1]]})
    assert res.finish_reason == "length" and res.output_ids == free.output_ids


def test_an_unknown_sampling_parameter_is_a_400_naming_it(client):
    with pytest.raises(EngineError) as err:
        client.generate(PROMPT, {"max_new_tokens": 2, "bogus_knob": 1})
    assert err.value.status == 400 and "bogus_knob" in str(err.value)


# -------------------------------------------------------------------------------------------- abort / pause
def test_abort_request_returns_the_partial_output_with_finish_reason_abort(client):
    bg = _decoding(client, LONG, rid="conf-abort")
    client.abort("conf-abort")
    res = bg.join()
    assert res.finish_reason == "abort" and 1 <= len(res.output_ids) < LONG
    assert len(res.logprobs) == len(res.output_ids) == res.completion_tokens
    assert res.weight_versions[-1].end == len(res.output_ids)


def test_pause_abort_aborts_running_requests_and_holds_new_ones_until_continue(client):
    bg = _decoding(client, LONG)
    client.pause("abort")
    res = bg.join()
    assert res.finish_reason == "abort" and len(res.output_ids) < LONG
    later = _Background(client, 3)
    assert later.held()
    client.resume()
    assert later.join().finish_reason == "length" and len(later.result.output_ids) == 3


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_pause_retract_and_in_place_hold_requests_that_finish_after_continue(client, mode):
    bg = _decoding(client, HELD)
    client.pause(mode)
    assert bg.held()
    if mode == "in_place":  # the request keeps its KV cache: nothing may be flushed
        with pytest.raises(EngineError) as err:
            client.flush_cache()
        assert err.value.status == 400
    client.resume()
    res = bg.join()
    assert res.finish_reason == "length" and len(res.output_ids) == HELD
    assert res.weight_versions[0].start == 0 and res.weight_versions[-1].end == HELD


# ---------------------------------------------------------------------------------------------- versions
def test_a_version_update_without_abort_keeps_in_flight_requests_and_splits_their_spans(client):
    old = client.weight_version()
    new = f"{old}-next"
    bg = _decoding(client, HELD)
    client.update_weight_version(new, abort_all_requests=False)
    res = bg.join()
    assert res.finish_reason == "length" and len(res.output_ids) == HELD
    spans = _spans(res)
    assert spans[0][:2] == (old, 0) and spans[-1][0] == new and spans[-1][2] == HELD
    assert all(a[2] == b[1] for a, b in zip(spans, spans[1:])) and len(spans) == 2
    assert res.weight_version == new
    assert client.weight_version() == new == client.model_info()["weight_version"]


def test_a_version_update_by_default_aborts_in_flight_requests(client):
    new = f"{client.weight_version()}-abort"
    bg = _decoding(client, LONG)
    r = httpx.post(client.url + "/update_weight_version", json={"new_version": new}, headers=_auth(), timeout=60)
    assert r.status_code == 200
    assert bg.join().finish_reason == "abort"
    assert client.weight_version() == new


def test_tensor_weight_updates_must_be_wrapped_in_begin_and_end(client):
    r = httpx.post(client.url + "/update_weights_from_tensor", json={"serialized_named_tensors": []},
                   headers=_auth(), timeout=60)
    assert r.status_code == 400
    client.begin_weight_update()
    with pytest.raises(EngineError) as twice:
        client.begin_weight_update()
    client.end_weight_update()
    with pytest.raises(EngineError) as unopened:
        client.end_weight_update()
    assert twice.value.status == unopened.value.status == 400


# ------------------------------------------------------------------------------------ distributed weights
def _other_weights(kind: str, tmp, seed: int = 1) -> dict:
    """Weights of the engine's architecture that differ from the ones it serves, under the names it loads (each
    ``seed`` its own: a test that loads them changes what the engine serves for the tests after it)."""
    if kind == "local":
        import torch

        from gyre_hpc.engines.weight_sync import engine_tensors
        from gyre_hpc.train.model import build_model

        state = {k: v for k, v in build_model(ModelConfig(), seed=6 + seed).state_dict().items() if isinstance(v, torch.Tensor)}
        return engine_tensors(state, ModelConfig())
    from gyre_hpc.train.hf_io import read_safetensors
    from gyre_hpc.models.init import init_model

    return read_safetensors(init_model("qwen3", tmp / "qwen3-other", head_dim=16, ffn=128, seed=seed))


def test_a_distributed_weight_update_shows_in_model_info_and_generation_and_splits_in_flight_spans(
        served, client, tmp_path_factory):
    greedy = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    before = client.generate(PROMPT, greedy).output_ids
    tensors = _other_weights(served.kind, tmp_path_factory.mktemp("other-weights"))
    old = client.weight_version()
    new = f"{old}-dist"
    pusher = WeightPusher(client)
    try:
        pusher.connect()  # the group is built once per engine; the update itself is short
        bg = _decoding(client, HELD)
        stats = pusher.push(tensors, new)
        res = bg.join()
    finally:
        pusher.close()
    _assert_updated_under_a_held_request(client, stats, len(tensors), res, old, new, before, greedy)


def test_a_bucketed_distributed_update_loads_what_one_whole_update_loads(served, client, tmp_path_factory):
    """Resharding's road (gyre_hpc/train/reshard.py): several ``/update_weights_from_distributed`` calls inside one
    begin/end, ``weight_version`` on the last only. The engine serves exactly what one whole update gives."""
    greedy = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    tensors = _other_weights(served.kind, tmp_path_factory.mktemp("other-weights-bucketed"), seed=3)
    names = list(tensors)
    third = -(-len(names) // 3)
    buckets = [{n: tensors[n] for n in names[i:i + third]} for i in range(0, len(names), third)]
    old = client.weight_version()
    pusher = WeightPusher(client)
    try:
        stats = pusher.push_stream([(b, i == len(buckets) - 1) for i, b in enumerate(buckets)], f"{old}-buckets")
        bucketed = client.generate(PROMPT, greedy)
        pusher.push(_other_weights(served.kind, tmp_path_factory.mktemp("other-weights-b2"), seed=4), "other")
        assert client.generate(PROMPT, greedy).output_ids != bucketed.output_ids  # seed 4 serves otherwise
        pusher.push(tensors, f"{old}-whole")
        whole = client.generate(PROMPT, greedy)
    finally:
        pusher.close()
    assert stats["buckets"] == 3 and stats["tensors"] == len(names)
    assert bucketed.weight_version == f"{old}-buckets" and whole.weight_version == f"{old}-whole"
    assert bucketed.output_ids == whole.output_ids and bucketed.logprobs == pytest.approx(whole.logprobs, abs=1e-5)


# ---------------------------------------------------------------------------------------- tensor weights
def test_a_tensor_weight_update_shows_in_model_info_and_generation_and_splits_in_flight_spans(
        served, client, tmp_path_factory):
    """The tensor road: SGLang's serialization (ForkingPickler, storages shared by file name on this host)."""
    greedy = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    before = client.generate(PROMPT, greedy).output_ids
    tensors = _other_weights(served.kind, tmp_path_factory.mktemp("other-weights-tensor"), seed=2)
    old = client.weight_version()
    new = f"{old}-tensor"
    bg = _decoding(client, HELD)
    client.pause("in_place")  # held for sure while the tensors are shared (the push pauses again, then continues)
    stats = TensorPusher(client, retries=0).push(tensors, new)
    res = bg.join()
    _assert_updated_under_a_held_request(client, stats, len(tensors), res, old, new, before, greedy)


def test_a_tensor_update_outside_begin_end_is_a_400_that_changes_nothing(client):
    version = client.weight_version()
    payload = encode(serialize([("model.embed_tokens.weight", torch.zeros(4, 4))]))
    with pytest.raises(EngineError) as unwrapped:
        client.update_weights_from_tensor([payload], "never")
    assert unwrapped.value.status == 400
    assert client.weight_version() == version


def test_a_distributed_update_outside_begin_end_or_to_an_unknown_group_is_a_400_that_changes_nothing(client):
    version = client.weight_version()
    args = (["model.embed_tokens.weight"], ["float32"], [[4, 4]], "never")
    with pytest.raises(EngineError) as unwrapped:
        client.update_weights_from_distributed(*args, group_name="no-such-group")
    client.begin_weight_update()
    try:
        with pytest.raises(EngineError) as unknown:
            client.update_weights_from_distributed(*args, group_name="no-such-group")
    finally:
        client.end_weight_update()
    assert unwrapped.value.status == unknown.value.status == 400
    assert client.weight_version() == version


# ------------------------------------------------------------------------------------------------ status
def test_flush_cache_succeeds_on_an_idle_engine(client):
    client.flush_cache()


def test_health_health_generate_loads_and_model_info(client):
    assert client.health()
    assert httpx.get(client.url + "/health_generate", headers=_auth(), timeout=120).status_code == 200
    assert (client.loads().running, client.loads().waiting) == (0, 0)
    info = client.model_info()
    assert info["is_generation"] is True and isinstance(info["weight_version"], str) and "model_path" in info


def test_an_sglang_server_on_the_cpu_sleeps_while_idle(served):
    """``--sleep-on-idle`` reached the server (engines.launch.sglang_command): its idle scheduler waits on its
    sockets instead of spinning a whole core. SGLang reports its arguments at /server_info."""
    if served.kind != "sglang":
        pytest.skip("an SGLang server argument; the local engine's decode loop waits on an event when idle")
    assert served.client.server_info()["sleep_on_idle"] is True
