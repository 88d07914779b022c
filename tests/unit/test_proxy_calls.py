"""One harness call across engine segments: request parsing, continuations after a move, the merged answer, TITO."""
import numpy as np
import pytest

from gyre_hpc.engines.protocol import GenerateResult, generate_response
from gyre_hpc.proxy.calls import CallSegment, answer, continuation, parse_call, tito_call
from gyre_hpc.proxy.routing import ProxyError
from gyre_hpc.trajectory.records import read_tito, write_tito, Outcome, RunStatus

INPUT = [1, 5, 9, 4]


def call(**sampling):
    body = {"input_ids": INPUT, "rid": "q0-r1/c3", "sampling_params": {"max_new_tokens": 8, **sampling},
            "return_logprob": True}
    return parse_call(body, default_max_new_tokens=128)


def seg(engine, out, versions, finish="abort"):
    return CallSegment(engine, tuple(out), tuple(-0.5 for _ in out), tuple(versions), {"type": finish})


def engine_answer(out, spans, finish, version=None, logprobs=True):
    versions = [v for v, start, end in spans for _ in range(start, end)]
    body = generate_response("x", 4, out, [-0.25] * len(out) if logprobs else None, versions, "9", finish, 0.1)
    if version is not None:  # an engine that reports only the last token's version
        body["meta_info"]["weight_versions"] = []
        body["meta_info"]["weight_version"] = version
    return GenerateResult.from_response(body)


# ---------------------------------------------------------------------------------------------- parsing
def test_rid_carries_run_and_call_ids_and_query_id_defaults_to_the_run_prefix():
    req = call()
    assert (req.run_id, req.call_id, req.query_id) == ("q0-r1", "c3", "q0")
    nested = parse_call({"input_ids": [1], "rid": "q7-r2/sub/1/c0", "query_id": "Q"}, 16)
    assert (nested.run_id, nested.call_id, nested.query_id, nested.max_new_tokens) == ("q7-r2/sub/1", "c0", "Q", 16)


@pytest.mark.parametrize("body,key", [
    ({"input_ids": [1]}, "rid"),
    ({"input_ids": [1], "rid": "no-call-id"}, "rid"),
    ({"input_ids": [1], "rid": "/c0"}, "rid"),
    ({"input_ids": [], "rid": "r/c"}, "input_ids"),
    ({"input_ids": [1, -2], "rid": "r/c"}, "input_ids"),
    ({"input_ids": [1], "rid": "r/c", "text": "hi"}, "text"),
    ({"input_ids": [1], "rid": "r/c", "stream": True}, "stream"),
    ({"input_ids": [1], "rid": "r/c", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
    ({"input_ids": [1], "rid": "r/c", "sampling_params": {"min_new_tokens": 1.5}}, "sampling_params.min_new_tokens"),
    ({"input_ids": [1], "rid": "r/c", "query_id": 3}, "query_id"),
    ({"input_ids": [1], "rid": "r/c", "return_logprob": 1}, "return_logprob"),
])
def test_bad_calls_are_400_naming_the_key(body, key):
    with pytest.raises(ProxyError) as err:
        parse_call(body, 128)
    assert err.value.status == 400 and str(err.value).startswith(f"{key}:")


# ------------------------------------------------------------------------------------------ continuation
def test_first_request_is_the_call_itself():
    ids, sampling = continuation(call(temperature=0.7), [])
    assert ids == INPUT and sampling == {"max_new_tokens": 8, "temperature": 0.7}


def test_continuation_is_input_plus_partial_and_max_new_tokens_shrinks():
    req = call(temperature=0.0, min_new_tokens=4, stop_token_ids=[3])
    ids, sampling = continuation(req, [seg("e0", [7, 2, 8], ["3"] * 3)])
    assert ids == INPUT + [7, 2, 8]
    assert sampling == {"max_new_tokens": 5, "min_new_tokens": 1, "temperature": 0.0, "stop_token_ids": [3]}
    ids, sampling = continuation(req, [seg("e0", [7, 2, 8], ["3"] * 3), seg("e1", [6, 6], ["4"] * 2)])
    assert ids == INPUT + [7, 2, 8, 6, 6] and sampling["max_new_tokens"] == 3 and sampling["min_new_tokens"] == 0


def test_a_call_whose_partial_output_is_complete_needs_no_continuation():
    assert continuation(call(), [seg("e0", range(8), ["0"] * 8)]) is None


# ----------------------------------------------------------------------------------------------- segments
def test_segment_versions_come_from_spans_or_from_the_single_version():
    s = CallSegment.of("e0", engine_answer([4, 4, 4], [("3", 0, 2), ("4", 2, 3)], {"type": "length", "length": 3}))
    assert s.versions == ("3", "3", "4") and s.logprobs == (-0.25,) * 3 and not s.aborted
    s = CallSegment.of("e0", engine_answer([4, 4], [], {"type": "abort"}, version="5"))
    assert s.versions == ("5", "5") and s.aborted


def test_segment_without_logprobs_is_a_502():
    with pytest.raises(ProxyError, match="output_token_logprobs") as err:
        CallSegment.of("e0", engine_answer([4], [("0", 0, 1)], {"type": "length"}, logprobs=False))
    assert err.value.status == 502


# ------------------------------------------------------------------------------------------------ answer
MOVED = [seg("e0", [7, 2, 8], ["3"] * 3), seg("e1", [6, 6, 1, 1, 5], ["4"] * 5, finish="length")]


def test_a_moved_call_is_one_sglang_answer():
    body = answer(call(), MOVED, 1.5, moves=1)
    res = GenerateResult.from_response(body)
    assert res.rid == "q0-r1/c3" and res.output_ids == (7, 2, 8, 6, 6, 1, 1, 5)
    assert res.prompt_tokens == 4 and res.completion_tokens == 8 and res.finish_reason == "length"
    assert [(s.version, s.start, s.end) for s in res.weight_versions] == [("3", 0, 3), ("4", 3, 8)]
    assert res.weight_version == "4" and res.logprobs == (-0.5,) * 8
    assert body["meta_info"]["proxy"] == {"engines": "e0>e1", "moves": 1}


def test_logprobs_reach_the_harness_only_when_asked():
    req = parse_call({"input_ids": INPUT, "rid": "r/c", "sampling_params": {"max_new_tokens": 8}}, 128)
    assert "output_token_logprobs" not in answer(req, MOVED, 1.0, 1)["meta_info"]


def test_a_moved_call_is_one_tito_call_with_per_span_versions(tmp_path):
    c = tito_call(call(), MOVED, 10.0, 12.5)
    assert c.engine == "e0>e1" and c.finish_reason == "length" and (c.t_start, c.t_end) == (10.0, 12.5)
    path = write_tito(tmp_path / "t.jsonl", [c], [Outcome("q0-r1", "q0", RunStatus.SCORED, 1.0)])
    back = read_tito(path).calls[0]
    assert back.input_ids.tolist() == INPUT and back.output_ids.tolist() == [7, 2, 8, 6, 6, 1, 1, 5]
    assert back.output_versions.tolist() == [3, 3, 3, 4, 4, 4, 4, 4]
    assert np.allclose(back.output_logprobs, -0.5)
    assert '"version_spans":[[0,3],[3,4]]' in path.read_text()


def test_an_engine_listed_twice_in_a_row_is_named_once():
    c = tito_call(call(), [seg("e0", [1], ["0"]), seg("e0", [2], ["0"], "length")], 0.0, 1.0)
    assert c.engine == "e0"


def test_a_non_decimal_weight_version_cannot_be_recorded():
    with pytest.raises(ProxyError, match="weight_version 'default'") as err:
        tito_call(call(), [seg("e0", [1], ["default"], "length")], 0.0, 1.0)
    assert err.value.status == 502
