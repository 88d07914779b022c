"""The agent harness against a real local engine process (and the real proxy in front of it).

One engine per module (torch + megatron import costs ~8-20 s); the proxy starts only for the test that uses it.
Runs sample at temperature 1 with a seed per call, so what a run does is reproducible but not scripted.
"""
import asyncio
import dataclasses

import numpy as np
import pytest

from gyre_hpc.agents.harness import Harness, read_runs
from gyre_hpc.agents.task import verify
from gyre_hpc.agents.workload import Workload
from gyre_hpc.config import AgentConfig, EngineConfig, ModelConfig, ProxyConfig, TrajectoryConfig
from gyre_hpc.engines.client import AsyncEngineClient
from gyre_hpc.engines.launch import free_port, on_free_port, start_local_engine
from gyre_hpc.errors import ConfigError
from gyre_hpc.trajectory.branches import classify
from gyre_hpc.trajectory.pipeline import build_batch
from gyre_hpc.trajectory.records import RunStatus, read_tito
from gyre_hpc.trajectory.tree import build_tree

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow, pytest.mark.serial]

MODEL = ModelConfig()  # vocab 256, hidden 64, 2 layers: the embedded CPU default
ENGINE = EngineConfig(max_running_requests=16, context_len=256, request_timeout_s=120.0)
AGENT = AgentConfig(turns=(2, 4), tool_failure_prob=0.3, subagent_prob=0.3, context_budget=64,
                    tool_time_median_s=0.01, tool_time_sigma=0.5, timeout_s=60.0)
SEED = 0


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    handle = on_free_port(start_local_engine, ENGINE, MODEL, seed=SEED,
                          log_path=tmp_path_factory.mktemp("engine") / "engine.log")
    yield handle
    handle.stop()


def harness(url, tmp_path, cfg=AGENT, **kw):
    return Harness(cfg, url, tmp_path / "tito", vocab_size=MODEL.vocab_size, seed=SEED,
                   context_len=ENGINE.context_len, request_timeout_s=120.0, **kw)


def same_calls(a, b):
    return [(c.call_id, c.input_ids.tolist(), c.output_ids.tolist()) for c in a] == \
        [(c.call_id, c.input_ids.tolist(), c.output_ids.tolist()) for c in b]


async def idle(url, timeout=10.0):
    client = AsyncEngineClient(url)
    try:
        for _ in range(int(timeout / 0.05)):
            if (await client.loads()).total == 0:
                return True
            await asyncio.sleep(0.05)
        return False
    finally:
        await client.aclose()


def test_runs_against_an_engine_leave_complete_consistent_tito(engine, tmp_path):
    h = harness(engine.url, tmp_path)
    results = h.run([0, 1, 2])
    assert len(results) == 3 * AGENT.runs_per_group
    log = read_runs([r.path for r in results], vocab_size=MODEL.vocab_size)  # validates every file
    assert {o.run_id for o in log.outcomes} == {r.run_id for r in results}
    kinds = set()
    for r in results:
        calls = log.runs[r.run_id]
        assert r.outcome.status is RunStatus.SCORED and same_calls(calls, r.calls)
        assert {b.call_id: b.kind.value for b in classify(build_tree(calls), calls)} == r.kinds
        kinds |= set(r.kinds.values())
        for c in calls:
            assert np.all(c.output_versions == 0) and np.all(c.output_logprobs <= 0)
            assert c.engine == engine.url and c.t_start <= c.t_end <= r.outcome.t_end
        task = Workload(AGENT, MODEL.vocab_size, SEED).task(int(r.run_id[1:].split("-")[0]))
        assert r.outcome.score == verify(calls[-1].output_ids, task.key, AGENT.key_classes, AGENT.answer_tokens)
    assert {"root", "continuation", "retry"} <= kinds
    batch, report = build_batch(log, TrajectoryConfig(max_row_tokens=1024))
    assert report.runs == len(results) and batch.validate().trained_tokens == report.trained_tokens


def test_timeouts_cut_runs_into_partial_or_unscorable_outcomes_and_free_the_engine(engine, tmp_path):
    cfg = dataclasses.replace(AGENT, timeout_s=0.6, tool_time_median_s=0.25, tool_time_sigma=0.0, turns=(4, 4))
    results = harness(engine.url, tmp_path, cfg).run([10, 11])
    statuses = {r.outcome.status for r in results}
    assert statuses <= {RunStatus.TIMEOUT_PARTIAL, RunStatus.TIMEOUT_UNSCORABLE} and RunStatus.TIMEOUT_PARTIAL in statuses
    for r in results:
        assert r.calls and all(c.t_end <= r.calls[0].t_start + cfg.timeout_s for c in r.calls)
        assert (r.outcome.score is None) == (r.outcome.status is RunStatus.TIMEOUT_UNSCORABLE)
    read_runs([r.path for r in results], vocab_size=MODEL.vocab_size)
    assert asyncio.run(idle(engine.url))


def test_injected_evaluation_failures_reach_the_outcome_files(engine, tmp_path):
    cfg = dataclasses.replace(AGENT, eval_failure_rate=1.0, turns=(0, 1))
    results = harness(engine.url, tmp_path, cfg).run([20])
    log = read_runs([r.path for r in results])
    assert {o.status for o in log.outcomes} == {RunStatus.EVAL_FAILURE}
    assert all(o.score is None for o in log.outcomes) and len(log.calls) >= len(results)


def test_an_engine_abort_is_reissued_from_the_same_input_and_the_run_still_finishes(engine, tmp_path):
    cfg = dataclasses.replace(AGENT, answer_tokens=40, call_tokens=16, abort_retries=10, turns=(1, 2))

    async def scenario():
        task = asyncio.create_task(harness(engine.url, tmp_path, cfg).run_async([30, 31]))
        client, aborts = AsyncEngineClient(engine.url), 0
        while not task.done() and aborts < 4:
            if (await client.loads()).running > 0:
                await client.abort_all()
                aborts += 1
            await asyncio.sleep(0.1)
        await client.aclose()
        return await task

    results = asyncio.run(scenario())
    assert all(r.outcome.status is RunStatus.SCORED for r in results)
    aborted = [(r, c) for r in results for c in r.calls if c.finish_reason == "abort"]
    assert aborted
    for r, c in aborted:  # c3 was aborted → c3a1 re-sends its input; c3a1 aborted → c3a2 ...
        base, _, attempt = c.call_id.partition("a")
        again = {x.call_id: x for x in r.calls}[f"{base}a{int(attempt or 0) + 1}"]
        assert np.array_equal(again.input_ids, c.input_ids)
    read_runs([r.path for r in results], vocab_size=MODEL.vocab_size)


def test_a_cancelled_harness_still_writes_an_outcome_for_every_started_run(engine, tmp_path):
    cfg = dataclasses.replace(AGENT, tool_time_median_s=0.5, tool_time_sigma=0.0, turns=(3, 3))
    h = harness(engine.url, tmp_path, cfg)

    async def scenario():
        task = asyncio.create_task(h.run_async([50, 51]))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    files = sorted((tmp_path / "tito").glob("*.jsonl"))
    assert [f.stem for f in files] == sorted(f"q{q}-r{j}" for q in (50, 51) for j in range(cfg.runs_per_group))
    log = read_runs(files, vocab_size=MODEL.vocab_size)
    assert {o.status for o in log.outcomes} == {RunStatus.ABORTED} and log.calls
    assert all("harness stopped: CancelledError" in o.detail for o in log.outcomes)


def test_behind_the_proxy_the_proxy_records_the_calls_and_gets_every_outcome(engine, tmp_path):
    from gyre_hpc.proxy.client import ProxyClient
    from gyre_hpc.proxy.launch import start_proxy

    proxy = on_free_port(start_proxy, ProxyConfig(request_timeout_s=120.0, tito_dir=str(tmp_path)), [(0, engine.url)],
                         log_path=tmp_path / "proxy.log", config_dir=tmp_path)
    try:
        results = harness(proxy.url, tmp_path, proxy=True).run([40, 41])
        with ProxyClient(proxy.url, timeout=60.0) as admin:
            admin.flush_tito("proxy.jsonl")
    finally:
        proxy.stop()
    assert all(r.post_error is None for r in results)
    recorded = read_tito(tmp_path / "proxy.jsonl", vocab_size=MODEL.vocab_size)
    local = read_runs([r.path for r in results])
    assert not local.calls and {o.run_id: o.status for o in local.outcomes} == \
        {o.run_id: o.status for o in recorded.outcomes}
    for r in results:
        assert same_calls(recorded.runs[r.run_id], r.calls)
        assert recorded.outcome[r.run_id].score == r.outcome.score


def test_an_unreachable_url_ends_every_run_aborted_with_its_outcome_written(tmp_path):
    cfg = dataclasses.replace(AGENT, abort_retries=1)
    h = Harness(cfg, f"http://127.0.0.1:{free_port()}", tmp_path, vocab_size=256, seed=SEED, connect_retries=0)
    results = h.run([0])
    log = read_runs([r.path for r in results])
    assert [o.status for o in log.outcomes] == [RunStatus.ABORTED] * cfg.runs_per_group
    assert all("no answer" in o.detail and o.score is None for o in log.outcomes) and not log.calls


def test_a_context_budget_beyond_the_engine_context_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"agent\.context_budget: 300 exceeds .*engine\.context_len=256"):
        Harness(dataclasses.replace(AGENT, context_budget=300), "http://127.0.0.1:1", tmp_path, vocab_size=256,
                seed=0, context_len=256)
