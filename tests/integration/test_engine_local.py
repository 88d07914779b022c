"""A real local engine process on 127.0.0.1 (megatron GPTModel on the CPU), driven through EngineClient.

One engine per module (starting one costs ~8 s of torch + megatron import). Tests that pause the engine resume
it before they return, and weight tests restore nothing: they only compare against what they loaded.
"""
import signal
import threading
import time

import httpx
import pytest
import torch

from gyre_hpc.net import auth
from gyre_hpc.config import EngineConfig, ModelConfig, TrainConfig
from gyre_hpc.engines.client import EngineClient
from gyre_hpc.engines.launch import free_port, on_free_port, start_local_engine
from gyre_hpc.engines.weights import save_weights, weights_checksum
from gyre_hpc.errors import EngineError


def _auth() -> dict:
    """The job secret the engines of this module were started with (``children.child_env``)."""
    return auth.bearer(auth.job_secret())

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow]

MODEL = ModelConfig()  # the embedded CPU default (tiny Qwen3 format)
ENGINE = EngineConfig(max_running_requests=8, context_len=256, startup_timeout_s=180.0, request_timeout_s=120.0)
SEED = 0
PROMPT = [5, 17, 42, 99, 3]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    handle = on_free_port(start_local_engine, ENGINE, MODEL, seed=SEED, log_path=log)
    yield handle
    assert handle.stop() is not None
    assert not handle.alive()


@pytest.fixture(scope="module")
def client(engine):
    with engine.client(timeout=120.0) as c:
        yield c


@pytest.fixture(scope="module")
def trainer_model():
    """The trainer's model, built in this process from the same config and seed as the engine's."""
    from gyre_hpc.train.step import Trainer

    return Trainer(MODEL, TrainConfig(), seed=SEED)


def _generated(client) -> int:
    return int(client.server_info()["generated_tokens"])


def _wait(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


class _Background:
    """A /generate call running in a thread (so the test can pause, abort or update meanwhile)."""

    def __init__(self, client, **kwargs):
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(client, kwargs))
        self.thread.start()

    def _run(self, client, kwargs):
        try:
            self.result = client.generate(**kwargs)
        except Exception as exc:  # handed to the test thread
            self.error = exc

    def join(self, timeout=60.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "generate did not return"
        if self.error:
            raise self.error
        return self.result


def _start_and_hold(client, rid, max_new_tokens=200, seed=11):
    """Start a long request, let it produce at least one token, then pause in place."""
    before = _generated(client)
    bg = _Background(client, input_ids=PROMPT, sampling_params={"max_new_tokens": max_new_tokens,
                                                                "sampling_seed": seed}, rid=rid)
    _wait(lambda: _generated(client) > before)
    client.pause("in_place")
    load = client.loads()
    if load.running + load.waiting < 1:
        client.resume()  # the module's engine serves the next tests: never leave it paused
        pytest.fail(f"{rid} finished before the pause: give it more max_new_tokens")
    return bg


# ------------------------------------------------------------------------------------------------- generate
def test_generate_returns_tokens_logprobs_and_version(client):
    res = client.generate(PROMPT, {"max_new_tokens": 12, "sampling_seed": 1}, rid="g1")
    assert res.rid == "g1" and len(res.output_ids) == 12 == res.completion_tokens
    assert res.finish_reason == "length" and res.prompt_tokens == len(PROMPT)
    assert len(res.logprobs) == 12 and all(lp <= 0.0 for lp in res.logprobs)
    assert all(0 <= t < MODEL.vocab_size for t in res.output_ids)
    assert res.weight_version == "0"
    assert [(s.version, s.start, s.end) for s in res.weight_versions] == [("0", 0, 12)]
    assert res.e2e_latency > 0 and res.cached_tokens == 0


def test_greedy_tokens_and_logprobs_match_the_trainers_model(client, trainer_model):
    from gyre_hpc.train.model import forward_logits

    res = client.generate(PROMPT, {"max_new_tokens": 8, "temperature": 0.0})
    seq = list(PROMPT)
    with torch.no_grad():
        for token, logprob in zip(res.output_ids, res.logprobs):
            s = len(seq)
            mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1).view(1, 1, s, s)
            logits = forward_logits(trainer_model.model, torch.tensor([seq]), torch.arange(s)[None], mask)[0, -1]
            logp = torch.log_softmax(logits.double(), -1)
            assert token == int(logp.argmax())
            assert logprob == pytest.approx(float(logp[token]), abs=1e-4)
            seq.append(token)


def test_same_sampling_seed_gives_same_tokens_and_other_seed_differs(client):
    params = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.9, "top_k": 50}
    a = client.generate(PROMPT, {**params, "sampling_seed": 1234})
    b = client.generate(PROMPT, {**params, "sampling_seed": 1234})
    c = client.generate(PROMPT, {**params, "sampling_seed": 4321})
    assert a.output_ids == b.output_ids and a.logprobs == b.logprobs
    assert c.output_ids != a.output_ids


def test_stop_token_ends_request_with_matched_token(client):
    free = client.generate(PROMPT, {"max_new_tokens": 6, "temperature": 0.0})
    stop = free.output_ids[2]
    first = free.output_ids.index(stop)
    res = client.generate(PROMPT, {"max_new_tokens": 6, "temperature": 0.0, "stop_token_ids": [stop]})
    assert res.finish_reason == "stop" and res.matched == stop
    assert res.output_ids == free.output_ids[: first + 1]


def test_unknown_sampling_key_is_400_naming_the_key(client, engine):
    with pytest.raises(EngineError) as err:
        client.generate(PROMPT, {"max_new_tokens": 4, "temprature": 0.5})
    assert err.value.status == 400 and "sampling_params.temprature" in str(err.value)
    raw = httpx.post(engine.url + "/generate", json={"input_ids": PROMPT, "sampling_params": {"bogus": 1}},
                     headers=_auth())
    assert raw.status_code == 400 and "bogus" in raw.json()["error"]["message"]


def test_out_of_vocabulary_and_too_long_prompts_are_400(client):
    with pytest.raises(EngineError, match=r"input_ids\[1\]") as err:
        client.generate([1, MODEL.vocab_size], {"max_new_tokens": 2})
    assert err.value.status == 400
    with pytest.raises(EngineError, match="context length") as err:
        client.generate([1] * ENGINE.context_len, {"max_new_tokens": 2})
    assert err.value.status == 400


def test_concurrent_requests_share_forward_passes_and_match_solo_runs(client):
    """Eight requests queued together decode in one batch: about 24 passes, not 8 x 24.

    The engine is paused until all eight wait, so the batch does not depend on how fast the
    requests arrive (under CI load, staggered arrivals batched only partially)."""
    prompts = [[i + 1, 2 * i + 3, 7] for i in range(8)]
    params = {"max_new_tokens": 24, "temperature": 0.0}
    solo = [client.generate(p, params).output_ids for p in prompts]
    calls_before = client.server_info()["forward_calls"]
    client.pause("in_place")
    try:
        bgs = [_Background(client, input_ids=p, sampling_params=params) for p in prompts]
        _wait(lambda: client.loads().waiting == len(prompts))
    finally:
        client.resume()
    results = [b.join() for b in bgs]
    calls = client.server_info()["forward_calls"] - calls_before
    assert [r.output_ids for r in results] == solo
    assert calls <= 24 + 2, f"{calls} forward passes for 8 x 24 tokens decoded together: requests were not batched"


def test_output_is_capped_by_the_context_length(client):
    prompt = [1] * (ENGINE.context_len - 6)
    res = client.generate(prompt, {"max_new_tokens": 20})
    assert res.finish_reason == "length" and len(res.output_ids) == 6


def test_at_most_max_running_requests_run_and_the_rest_wait(client):
    client.pause("in_place")
    n = ENGINE.max_running_requests + 2
    bgs = [_Background(client, input_ids=PROMPT, sampling_params={"max_new_tokens": 50}) for _ in range(n)]
    try:
        _wait(lambda: client.loads().waiting == n)
        before = _generated(client)
        client.resume()
        _wait(lambda: _generated(client) > before)
        client.pause("in_place")
        load = client.loads()
        assert (load.running, load.waiting) == (ENGINE.max_running_requests, 2)
    finally:
        client.resume()
    assert all(len(b.join().output_ids) == 50 for b in bgs)


# ------------------------------------------------------------------------------------- abort / pause modes
def test_abort_returns_partial_output_with_abort_reason(client):
    bg = _start_and_hold(client, "to-abort")
    try:
        client.abort("to-abort")
        res = bg.join()
    finally:
        client.resume()
    assert res.finish_reason == "abort"
    assert 1 <= len(res.output_ids) < 200 and len(res.logprobs) == len(res.output_ids)
    assert res.weight_versions[-1].end == len(res.output_ids)


def test_a_caller_that_hangs_up_frees_its_request(client, engine):
    client.pause("in_place")
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(engine.url + "/generate", json={"input_ids": PROMPT, "rid": "gone"}, timeout=0.5,
                       headers=_auth())
        _wait(lambda: client.loads().waiting == 0, timeout=5.0)
    finally:
        client.resume()


def test_pause_in_place_holds_requests_and_refuses_flush_until_continue(client):
    bg = _start_and_hold(client, "held", max_new_tokens=200)
    try:
        frozen = _generated(client)
        time.sleep(0.3)
        assert _generated(client) == frozen and bg.thread.is_alive()
        load = client.loads()
        assert (load.running, load.waiting) == (1, 0)
        with pytest.raises(EngineError) as err:
            client.flush_cache()
        assert err.value.status == 400
    finally:
        client.resume()
    res = bg.join()
    assert res.finish_reason == "length" and len(res.output_ids) == 200


def test_retract_requeues_and_resumes_to_the_same_tokens(client):
    params = {"max_new_tokens": 200, "sampling_seed": 77}  # long enough to be mid-generation when paused
    straight = client.generate(PROMPT, params)
    bg = _start_and_hold(client, "retracted", max_new_tokens=200, seed=77)
    try:
        client.pause("retract")
        load = client.loads()
        assert (load.running, load.waiting) == (0, 1)
        client.flush_cache()  # allowed: nothing runs, the waiting request is retracted
    finally:
        client.resume()
    assert bg.join().output_ids == straight.output_ids


def test_pause_abort_mode_aborts_running_and_queues_new_requests(client):
    bg = _start_and_hold(client, "victim")
    client.pause("abort")
    assert bg.join().finish_reason == "abort"
    waiting = [_Background(client, input_ids=PROMPT, sampling_params={"max_new_tokens": 3}) for _ in range(3)]
    try:
        _wait(lambda: client.loads().waiting == 3)
        assert client.loads().running == 0
    finally:
        client.resume()
    assert [len(w.join().output_ids) for w in waiting] == [3, 3, 3]


# ------------------------------------------------------------------------------------------ weight updates
def test_initial_weights_are_the_trainers_initial_weights(client, trainer_model):
    assert client.weights_checksum() == weights_checksum(trainer_model.export_weights())


#: tokens of the request that spans a weight update: enough to still run when the pause comes on a loaded machine
#: (30 finished first once, in CI under load)
SPANNING = 120


def test_update_from_disk_changes_checksum_and_version_including_a_spanning_request(client, tmp_path):
    from gyre_hpc.train.step import Trainer

    new = Trainer(MODEL, TrainConfig(), seed=SEED + 1).export_weights()
    path = save_weights(tmp_path / "w1", new, "1")
    before = client.weights_checksum()
    bg = _start_and_hold(client, "spanning", max_new_tokens=SPANNING)
    try:
        client.update_weights_from_disk(str(path), version="1")
    finally:
        client.resume()
    res = bg.join()
    assert client.weights_checksum() == weights_checksum(new) != before
    assert client.weight_version() == "1" and client.model_info()["weight_version"] == "1"
    spans = [(s.version, s.start, s.end) for s in res.weight_versions]
    k = spans[0][2]
    assert spans == [("0", 0, k), ("1", k, SPANNING)] and 0 < k < SPANNING
    assert res.weight_version == "1"
    after = client.generate(PROMPT, {"max_new_tokens": 4})
    assert [(s.version, s.start, s.end) for s in after.weight_versions] == [("1", 0, 4)]


def test_bad_weights_directory_is_400_and_keeps_loaded_weights(client, tmp_path):
    before, version = client.weights_checksum(), client.weight_version()
    with pytest.raises(EngineError) as err:
        client.update_weights_from_disk(str(tmp_path / "missing"), version="99")
    assert err.value.status == 400
    save_weights(tmp_path / "foreign", {"x": torch.zeros(2)}, "98")
    with pytest.raises(EngineError, match="do not fit"):
        client.update_weights_from_disk(str(tmp_path / "foreign"), version="98")
    assert (client.weights_checksum(), client.weight_version()) == (before, version)


def test_update_weight_version_relabels_and_tensor_updates_need_begin_end(client, engine):
    current = client.weight_version()
    client.update_weight_version("relabelled")
    assert client.weight_version() == "relabelled"
    client.update_weight_version(current)
    r = httpx.post(engine.url + "/update_weights_from_tensor", json={"serialized_named_tensors": []},
                   headers=_auth())
    assert r.status_code == 400 and "begin_weight_update" in r.json()["message"]
    client.begin_weight_update()
    with pytest.raises(EngineError):
        client.begin_weight_update()
    client.end_weight_update()
    with pytest.raises(EngineError) as err:
        client.end_weight_update()
    assert err.value.status == 400


# -------------------------------------------------------------------------------------------- status / launch
def test_health_endpoints_and_loads(client, engine):
    assert client.health()
    assert httpx.get(engine.url + "/health_generate", timeout=30, headers=_auth()).status_code == 200
    load = client.loads()
    assert (load.running, load.waiting) == (0, 0)


def test_stopping_an_engine_returns_pending_requests_as_aborted(tmp_path, monkeypatch):
    import socket

    # started from a process whose torch.distributed rendezvous port is taken (a trainer's), it still starts
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(busy.getsockname()[1]))
    try:
        handle = on_free_port(start_local_engine, ENGINE, MODEL, seed=SEED, log_path=tmp_path / "e.log")
    finally:
        busy.close()
    with handle, handle.client(timeout=60.0) as c:
        bg = _start_and_hold(c, "interrupted")
        t0 = time.monotonic()
        assert handle.stop() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a graceful shutdown
        res = bg.join()
        assert time.monotonic() - t0 < 8.0
    assert res.finish_reason == "abort" and len(res.output_ids) >= 1
    assert not handle.alive()


def test_launch_reports_a_bad_config_with_the_log_tail(tmp_path):
    bad = EngineConfig(context_len=MODEL.max_seq_len + 1, startup_timeout_s=60.0)
    with pytest.raises(EngineError, match="context_len"):
        on_free_port(start_local_engine, bad, MODEL, log_path=tmp_path / "bad.log")


def test_client_maps_an_unreachable_engine_to_engine_error():
    with EngineClient(f"http://127.0.0.1:{free_port()}", connect_retries=1, connect_timeout=1.0) as c:
        assert not c.health()
        with pytest.raises(EngineError) as err:
            c.generate(PROMPT)
    assert err.value.status is None and err.value.endpoint == "/generate"


# ------------------------------------------------------------------------------------- sleep / wake
def test_a_sleeping_engine_refuses_generation_and_wakes_with_the_same_weights_and_version(client, tmp_path):
    from gyre_hpc.localengine.policy import MegatronPolicy

    seed_state = MegatronPolicy(MODEL, seed=SEED, threads=1).state()
    save_weights(tmp_path / "v7", {k: v + 0.01 for k, v in seed_state.items()}, "7")
    client.update_weights_from_disk(str(tmp_path / "v7"), "7")
    before = client.weights_checksum()
    client.release_memory()
    assert client.server_info()["memory_released"] == ["cuda_graph", "kv_cache", "weights"]
    with pytest.raises(EngineError) as err:
        client.generate(PROMPT, {"max_new_tokens": 2})
    assert err.value.status == 503 and "resume_memory_occupation" in str(err.value)
    client.resume_memory()
    assert client.server_info()["memory_released"] == []
    assert client.weights_checksum() == before and client.weight_version() == "7"
    assert len(client.generate(PROMPT, {"max_new_tokens": 3}).output_ids) == 3


def test_memory_is_not_released_while_requests_run_and_bad_tags_are_400(client):
    held = _start_and_hold(client, "held-for-release", max_new_tokens=200)
    try:
        with pytest.raises(EngineError, match="pause generation and let them finish") as err:
            client.release_memory(["kv_cache"])
        assert err.value.status == 400 and client.server_info()["memory_released"] == []
    finally:
        client.resume()
    assert len(held.join().output_ids) == 200
    with pytest.raises(EngineError, match="tags") as err:
        client.release_memory(["gpu"])
    assert err.value.status == 400

