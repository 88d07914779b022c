"""SGLang protocol validation, answer shapes and sampling: pure Python/numpy, no engine process."""
import numpy as np
import pytest

from gyre_hpc.engines import protocol as P
from gyre_hpc.localengine.sampling import kept_mask, log_softmax, sample
from gyre_hpc.errors import EngineError


# --------------------------------------------------------------------------------------------- sampling params
def test_sampling_defaults_follow_sglang_and_engine_default_max_new_tokens():
    sp = P.parse_sampling_params(None, default_max_new_tokens=7)
    assert sp == P.SamplingParams(max_new_tokens=7)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.ignore_eos, sp.sampling_seed) == (1.0, 1.0, -1, False, None)


def test_unknown_sampling_key_names_the_key_and_lists_valid_keys():
    with pytest.raises(P.EngineRequestError) as err:
        P.parse_sampling_params({"max_new_tokens": 3, "temprature": 0.7})
    assert err.value.status == 400 and err.value.key == "sampling_params.temprature"
    assert "valid keys: max_new_tokens, temperature" in str(err.value)


@pytest.mark.parametrize("key,value", [
    ("top_p", 0.0), ("top_p", 1.5), ("top_k", 0), ("top_k", -2), ("temperature", -0.1), ("max_new_tokens", "5"),
    ("max_new_tokens", -1), ("ignore_eos", 1), ("stop_token_ids", [1, -3]), ("stop_token_ids", 5),
    ("sampling_seed", 1.5), ("temperature", float("nan")),
])
def test_out_of_range_or_mistyped_sampling_values_are_refused(key, value):
    with pytest.raises(P.EngineRequestError) as err:
        P.parse_sampling_params({key: value})
    assert err.value.key.startswith(f"sampling_params.{key}")


def test_unimplemented_sglang_keys_pass_only_at_their_default():
    sp = P.parse_sampling_params({"frequency_penalty": 0.0, "n": 1, "stop": None, "skip_special_tokens": True,
                                  "logit_bias": {}, "min_p": 0})
    assert sp == P.SamplingParams()
    for key, value in [("frequency_penalty", 0.5), ("n", 2), ("stop", ["\n"]), ("skip_special_tokens", 1),
                       ("regex", "a+")]:
        with pytest.raises(P.EngineRequestError, match="not supported by the local engine"):
            P.parse_sampling_params({key: value})


def test_implemented_sampling_values_are_kept():
    sp = P.parse_sampling_params({"max_new_tokens": 0, "temperature": 0, "top_p": 0.5, "top_k": 3,
                                  "stop_token_ids": [4, 9], "ignore_eos": True, "sampling_seed": 12,
                                  "min_new_tokens": 2})
    assert sp == P.SamplingParams(0, 0.0, 0.5, 3, 2, (4, 9), True, 12)


# ----------------------------------------------------------------------------------------------- /generate
def test_generate_body_is_validated_and_rid_is_generated_when_missing():
    a = P.parse_generate({"input_ids": [1, 2], "return_logprob": True}, vocab_size=10)
    b = P.parse_generate({"input_ids": [1, 2]}, vocab_size=10)
    assert a.input_ids == (1, 2) and a.return_logprob and not b.return_logprob
    assert a.rid and b.rid and a.rid != b.rid
    assert P.parse_generate({"input_ids": [3], "rid": "r"}, 10).rid == "r"


@pytest.mark.parametrize("body,key", [
    ({}, "input_ids"), ({"input_ids": []}, "input_ids"), ({"input_ids": [[1, 2]]}, "input_ids"),
    ({"input_ids": [1, 10]}, "input_ids[1]"), ({"input_ids": [1, -1]}, "input_ids[1]"),
    ({"input_ids": [1], "text": "hi"}, "text"), ({"input_ids": [1], "stream": True}, "stream"),
    ({"input_ids": [1], "temperature": 0}, "temperature"), ({"input_ids": [1], "rid": 5}, "rid"),
    ({"input_ids": [1], "return_logprob": "yes"}, "return_logprob"), ([1, 2], "body"),
])
def test_bad_generate_bodies_name_the_offending_key(body, key):
    with pytest.raises(P.EngineRequestError) as err:
        P.parse_generate(body, vocab_size=10)
    assert err.value.key == key


def test_generate_accepts_sglang_top_level_defaults():
    req = P.parse_generate({"input_ids": [1], "stream": False, "logprob_start_len": -1, "top_logprobs_num": 0,
                            "return_text_in_logprobs": False}, 10)
    assert req.input_ids == (1,)


# ------------------------------------------------------------------------------------------------- control
def test_control_bodies_have_sglang_defaults_and_refuse_bad_values():
    assert P.parse_pause({}) == "abort" and P.parse_pause({"mode": "retract"}) == "retract"
    with pytest.raises(P.EngineRequestError, match="mode"):
        P.parse_pause({"mode": "sleep"})
    assert P.parse_abort({"rid": "x"}) == ("x", False) and P.parse_abort({"abort_all": True}) == (None, True)
    assert P.parse_update_weight_version({"new_version": "3"}) == ("3", True)
    upd = P.parse_update_from_disk({"model_path": "/w", "weight_version": "2"})
    assert upd == P.DiskUpdate("/w", "2", False, True)
    for bad, key in [({}, "model_path"), ({"model_path": "/w", "weight_version": 2}, "weight_version"),
                     ({"model_path": "/w", "colour": 1}, "colour")]:
        with pytest.raises(P.EngineRequestError) as err:
            P.parse_update_from_disk(bad)
        assert err.value.key == key


# ----------------------------------------------------------------------------------------------- responses
def test_version_spans_partition_the_output_into_runs_of_one_version():
    rng = np.random.default_rng(0)
    for _ in range(200):
        versions = [str(v) for v in np.sort(rng.integers(0, 4, size=rng.integers(0, 12)))]
        spans = P.version_spans(versions)
        assert [v for s in spans for v in [s["version"]] * (s["end"] - s["start"])] == versions
        assert all(a["end"] == b["start"] and a["version"] != b["version"] for a, b in zip(spans, spans[1:]))
        assert (spans[0]["start"], spans[-1]["end"]) == (0, len(versions)) if versions else spans == []


def test_generate_response_round_trips_through_generate_result():
    body = P.generate_response("r1", 3, [7, 8, 9], [-0.5, -1.0, -2.0], ["1", "1", "2"], "2",
                               P.finish_stop(9), 0.25)
    res = P.GenerateResult.from_response(body)
    assert (res.rid, res.output_ids, res.logprobs, res.finish_reason, res.matched) == (
        "r1", (7, 8, 9), (-0.5, -1.0, -2.0), "stop", 9)
    assert [(s.version, s.start, s.end) for s in res.weight_versions] == [("1", 0, 2), ("2", 2, 3)]
    assert (res.weight_version, res.prompt_tokens, res.completion_tokens, res.cached_tokens) == ("2", 3, 3, 0)
    assert body["meta_info"]["output_token_logprobs"][0] == [-0.5, 7, None]
    aborted = P.GenerateResult.from_response(P.generate_response("r", 1, [], None, [], "0", P.finish_abort(), 0.1))
    assert aborted.aborted and aborted.logprobs is None and aborted.weight_version == "0"


@pytest.mark.parametrize("body", [
    {}, {"output_ids": [1]}, {"output_ids": [1], "meta_info": {"finish_reason": None, "prompt_tokens": 1}},
    {"output_ids": [1], "meta_info": {"finish_reason": {"type": "length"}, "prompt_tokens": 1,
                                      "completion_tokens": 1, "output_token_logprobs": [[-1.0, 2, None]]}},
])
def test_malformed_generate_answers_are_engine_errors(body):
    with pytest.raises(EngineError, match="malformed /generate answer"):
        P.GenerateResult.from_response(body)


def test_loads_response_counts_running_and_waiting():
    body = P.loads_response(3, 2, 8, 100, 2048, "t", "v")
    assert body["loads"][0]["num_total_reqs"] == 5 and body["aggregate"]["total_reqs"] == 5
    assert body["dp_rank_count"] == 1


# ------------------------------------------------------------------------------------------------ sampling
LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])


def test_greedy_takes_argmax_and_consumes_no_randomness():
    rng = np.random.default_rng(1)
    token, logprob = sample(LOGITS, P.SamplingParams(temperature=0.0), rng)
    assert token == 5 and logprob == pytest.approx(log_softmax(LOGITS)[5])
    assert rng.random() == np.random.default_rng(1).random()


def test_each_draw_consumes_exactly_one_uniform():
    rng, ref = np.random.default_rng(2), np.random.default_rng(2)
    for _ in range(5):
        sample(LOGITS, P.SamplingParams(top_p=0.8, top_k=4), rng)
        ref.random()
    assert rng.random() == ref.random()


def test_sampled_token_stays_in_the_kept_set_and_never_suppressed():
    rng = np.random.default_rng(3)
    sp = P.SamplingParams(temperature=1.5, top_k=3)
    tokens = {sample(LOGITS, sp, rng, suppressed=[5])[0] for _ in range(300)}
    assert tokens == {0, 1, 2}  # top-3 of the logits without token 5
    assert {sample(LOGITS, P.SamplingParams(top_p=0.01), rng)[0] for _ in range(50)} == {5}


def test_top_p_keeps_smallest_prefix_reaching_the_mass():
    logp = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert kept_mask(logp, -1, 0.5).tolist() == [True, False, False, False]
    assert kept_mask(logp, -1, 0.8).tolist() == [True, True, False, False]
    assert kept_mask(logp, -1, 0.81).tolist() == [True, True, True, False]
    assert kept_mask(logp, 2, 1.0).tolist() == [True, True, False, False]


def test_samples_follow_the_temperature_scaled_distribution_and_report_its_logprob():
    rng = np.random.default_rng(4)
    sp = P.SamplingParams(temperature=2.0)
    draws = [sample(LOGITS, sp, rng) for _ in range(20000)]
    expected = np.exp(log_softmax(LOGITS / 2.0))
    freq = np.bincount([t for t, _ in draws], minlength=6) / len(draws)
    assert np.abs(freq - expected).max() < 0.015
    assert all(lp == pytest.approx(np.log(expected[t])) for t, lp in draws[:50])


def test_same_seed_same_tokens_other_seed_other_tokens():
    sp = P.SamplingParams(temperature=1.0)

    def run(seed):
        rng = np.random.default_rng(seed)
        return [sample(LOGITS, sp, rng)[0] for _ in range(30)]

    assert run(9) == run(9) != run(10)


def test_async_client_offers_every_call_of_the_sync_client():
    import inspect

    from gyre_hpc.engines.client import AsyncEngineClient, EngineClient

    def calls(cls):
        return {n for n, f in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")} - {"close", "aclose"}

    assert calls(EngineClient) == calls(AsyncEngineClient)
    assert all(inspect.iscoroutinefunction(getattr(AsyncEngineClient, n)) for n in calls(AsyncEngineClient))


def test_sglang_command_needs_a_model_path_and_passes_engine_settings():
    from gyre_hpc.config import EngineConfig
    from gyre_hpc.engines.launch import sglang_command

    with pytest.raises(EngineError, match="model_path"):
        sglang_command(EngineConfig(kind="sglang"), 30001)
    cmd = sglang_command(EngineConfig(kind="sglang", model_path="/m", sglang_args=("--attention-backend",
                                                                                     "torch_native")), 30001)
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and "--skip-tokenizer-init" in cmd
    assert cmd[cmd.index("--model-path") + 1] == "/m" and cmd[cmd.index("--port") + 1] == "30001"
    assert cmd[-2:] == ["--attention-backend", "torch_native"]
    assert "--device" not in cmd and "--max-total-tokens" not in cmd  # on a GPU SGLang sizes its KV cache itself


def test_sglang_on_cpu_gets_the_cpu_device_env_a_bounded_kv_cache_and_sleeps_when_idle():
    from gyre_hpc.config import EngineConfig
    from gyre_hpc.engines.launch import sglang_command, sglang_device, sglang_env

    cfg = EngineConfig(kind="sglang", model_path="/m", max_running_requests=4, context_len=512, device="cpu")
    cmd = sglang_command(cfg, 30001, sglang_device(cfg))
    assert cmd[cmd.index("--device") + 1] == "cpu" and cmd[cmd.index("--max-total-tokens") + 1] == str(4 * 512)
    assert "--sleep-on-idle" in cmd  # an idle scheduler spins a whole core otherwise
    assert sglang_env("cpu") == {"SGLANG_USE_CPU_ENGINE": "1"} and sglang_env("cuda") == {}
    sized = sglang_command(EngineConfig(kind="sglang", model_path="/m", max_total_tokens=999), 30001, "cuda")
    assert sized[sized.index("--max-total-tokens") + 1] == "999" and "--device" not in sized
    assert "--sleep-on-idle" not in sized  # on a GPU SGLang's own default, unless asked
    for asked, device in ((True, "cuda"), (False, "cpu")):
        cmd = sglang_command(EngineConfig(kind="sglang", model_path="/m", sglang_sleep_on_idle=asked), 30001, device)
        assert ("--sleep-on-idle" in cmd) is asked


def test_sglangs_tmpdir_is_its_scratch_unless_the_path_leaves_no_room_for_an_ipc_socket_name():
    from pathlib import Path

    from gyre_hpc.engines.launch import SGLANG_TMPDIR_MAX, sglang_tmpdir

    assert sglang_tmpdir(Path("/tmp/gyre-sglang-abcdefgh")) == {"TMPDIR": "/tmp/gyre-sglang-abcdefgh"}
    fits = "/" + "d" * (SGLANG_TMPDIR_MAX - 1)
    assert sglang_tmpdir(Path(fits)) == {"TMPDIR": fits}
    assert len(fits) + len("/tmpXXXXXXXX") < 108  # a unix socket's path, NUL included, fits in sun_path
    assert sglang_tmpdir(Path(fits + "d")) == {}  # SGLang then keeps the caller's TMPDIR


def test_a_scratch_directory_is_private_and_made_where_the_caller_says(tmp_path):
    from gyre_hpc.engines.launch import scratch_dir

    cell = tmp_path / "run" / "cells" / "cell0"  # made when missing
    scratch = scratch_dir("sglang", cell)
    assert scratch.parent == cell and scratch.name.startswith("gyre-sglang-")
    assert scratch.stat().st_mode & 0o777 == 0o700  # it holds SGLang's api-key config


def test_sglang_is_refused_a_model_directory_it_would_find_no_weights_in(tmp_path):
    import pytest

    from gyre_hpc.engines.launch import require_weights
    from gyre_hpc.errors import EngineError

    with pytest.raises(EngineError, match="cell1 \\(sglang\\): engine.model_path=.* is not a directory"):
        require_weights(tmp_path / "missing", "cell1 (sglang)")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EngineError, match="holds no model weights"):
        require_weights(tmp_path, "cell1 (sglang)")
    for name in ("model-00001-of-00002.safetensors", "pytorch_model.bin", "model.pt"):
        weights = tmp_path / name
        weights.write_bytes(b"")
        require_weights(tmp_path, "cell1 (sglang)")  # any of SGLang's default load formats will do
        weights.unlink()


def test_client_reads_both_error_shapes_sglang_and_local_engine_answer_with():
    import httpx

    from gyre_hpc.engines.client import _error_message

    assert _error_message(httpx.Response(400, json={"error": "unknown field `knob`"})) == "unknown field `knob`"
    assert _error_message(httpx.Response(400, json={"error": {"message": "input_ids: bad"}})) == "input_ids: bad"


def test_sglang_sleeping_through_training_gets_the_memory_saver_on_a_gpu_only():
    from gyre_hpc.config import EngineConfig
    from gyre_hpc.engines.launch import sglang_command

    def cmd(device: str, **kw) -> list[str]:
        return sglang_command(EngineConfig(kind="sglang", model_path="/m", **kw), 30001, device)

    assert "--enable-memory-saver" in cmd("cuda", sleep_in_training=True)
    assert "--enable-memory-saver" not in cmd("cpu", sleep_in_training=True)  # release/resume are no-ops on cpu
    assert "--enable-memory-saver" not in cmd("cuda", sleep_in_training=False)
    given = cmd("cuda", sleep_in_training=True, sglang_args=("--enable-memory-saver",))
    assert given.count("--enable-memory-saver") == 1
