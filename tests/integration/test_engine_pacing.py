"""The local engine's emulated accelerator (``engine.device_tick_s``): the real scheduler and megatron policy,
in this process, driven through ``parse_generate`` as the HTTP handler does.

Pacing must change only time: the same requests give the same tokens, and every tick over n requests lasts at
least ``device_tick_s * (1 + n / device_half_load)``. That the wait leaves the CPU free (a sleep, not a spin) is a
speed property: benchmarks measure it, tests do not assert CPU/wall ratios (issue 14).
"""
import asyncio
import dataclasses
import time

import pytest

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.localengine.policy import MegatronPolicy
from gyre_hpc.engines.protocol import parse_generate
from gyre_hpc.localengine.scheduler import Scheduler

pytestmark = [pytest.mark.megatron]

MODEL = ModelConfig()
PLAIN = EngineConfig(max_running_requests=4)
PACED = dataclasses.replace(PLAIN, device_tick_s=0.02, device_half_load=2.0)
PROMPTS = [[3, 1, 4], [1, 5, 9, 2], [6, 5], [3, 5, 8, 9, 7]]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def policy():
    return MegatronPolicy(MODEL, seed=0, threads=1)


def _serve(policy, cfg):
    """Generate every prompt together; (output ids, forward calls, wall seconds)."""
    async def main():
        sched = Scheduler(policy, cfg, seed=0)
        loop = asyncio.create_task(sched.run())
        try:
            reqs = [parse_generate({"input_ids": p, "sampling_params": {"max_new_tokens": NEW_TOKENS,
                                                                         "temperature": 0.0}}, MODEL.vocab_size)
                    for p in PROMPTS]
            t0 = time.perf_counter()
            out = await asyncio.gather(*(sched.generate(r) for r in reqs))
            return [o["output_ids"] for o in out], sched.forward_calls, time.perf_counter() - t0
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
    return asyncio.run(main())


def test_pacing_changes_the_time_not_the_tokens(policy):
    plain_ids, plain_calls, _ = _serve(policy, PLAIN)
    paced_ids, paced_calls, wall = _serve(policy, PACED)
    assert paced_ids == plain_ids and paced_calls == plain_calls == NEW_TOKENS
    floor = PACED.device_tick_s * (1 + len(PROMPTS) / PACED.device_half_load)  # 4 requests in every tick: 0.06 s
    assert wall >= NEW_TOKENS * floor  # a lower bound the pacing guarantees, whatever the load


def test_a_bad_device_setting_is_a_config_error_naming_the_key():
    from gyre_hpc.config import load_config
    from gyre_hpc.errors import ConfigError

    with pytest.raises(ConfigError, match="engine.device_half_load"):
        load_config(None, ["engine.device_half_load=0"])
    with pytest.raises(ConfigError, match="engine.device_tick_s"):
        load_config(None, ["engine.device_tick_s=-1"])
