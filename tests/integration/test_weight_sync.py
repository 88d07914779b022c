"""The weight road's failure handling against a real local engine: a refused update is retried on a fresh group a
bounded number of times, then a typed error; the engine is left serving (not paused, not mid-update) its old
version, and the next good push loads exactly the sender's tensors (checksum of the HF names mapped back)."""
import pytest
import torch

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.launch import on_free_port, start_engine
from gyre_hpc.engines.weight_sync import WeightPusher, WeightSyncError, engine_tensors
from gyre_hpc.engines.weights import weights_checksum
from gyre_hpc.train.model import build_model

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    cfg = EngineConfig(max_running_requests=4, context_len=256, startup_timeout_s=300.0, request_timeout_s=300.0)
    handle = on_free_port(start_engine, cfg, ModelConfig(), log_path=tmp_path_factory.mktemp("ws") / "engine.log",
                          name="weight-sync")
    client = handle.client(timeout=300.0)
    yield client
    client.close()
    handle.stop()


def _state(seed: int) -> dict:
    return {k: v for k, v in build_model(ModelConfig(), seed=seed).state_dict().items() if isinstance(v, torch.Tensor)}


def test_a_refused_update_is_retried_on_fresh_groups_then_raises_and_the_engine_keeps_serving(client):
    before = client.weight_version()
    tensors = engine_tensors(_state(3), ModelConfig())
    tensors.pop("model.norm.weight")  # the engine receives them all, then refuses: the model is not covered
    pusher = WeightPusher(client, retries=2)
    with pytest.raises(WeightSyncError) as err:
        pusher.push(tensors, "never")
    assert len(pusher.attempts) == 3 and "model.norm.weight" in str(err.value) and pusher.pg is None
    assert client.weight_version() == before
    assert not client.server_info()["paused"]
    assert len(client.generate([5, 17, 42], {"max_new_tokens": 3, "ignore_eos": True}).output_ids) == 3
    client.begin_weight_update()  # no update was left open
    client.end_weight_update()


def test_a_good_push_after_failures_loads_exactly_the_senders_weights(client):
    state = _state(4)
    pusher = WeightPusher(client)
    try:
        stats = pusher.push(engine_tensors(state, ModelConfig()), "41")
        again = pusher.push(engine_tensors(state, ModelConfig()), "42")  # same group, second version
    finally:
        pusher.close()
    assert stats["attempt"] == again["attempt"] == 0 and stats["bytes"] == again["bytes"] > 0
    assert client.weight_version() == "42" and client.weights_checksum() == weights_checksum(state)


def test_streamed_buckets_load_only_once_they_cover_the_model(client):
    """Buckets without a version are staged; the last one (with the version) loads them all at once. A stream whose
    last bucket leaves the model uncovered loads nothing and keeps the old version."""
    from gyre_hpc.errors import EngineError

    before, checksum = client.weight_version(), client.weights_checksum()
    state = _state(5)
    tensors = engine_tensors(state, ModelConfig())
    names = list(tensors)
    parts = [{n: tensors[n] for n in names[i::3]} for i in range(3)]
    pusher = WeightPusher(client)
    try:
        short = dict(parts[2])
        short.pop(next(iter(short)))
        with pytest.raises(EngineError):
            pusher.push_stream([(parts[0], False), (parts[1], False), (short, True)], "half")
        pusher.reset()
        assert client.weight_version() == before and client.weights_checksum() == checksum
        stats = pusher.push_stream([(parts[0], False), (parts[1], False), (parts[2], True)], "77")
    finally:
        pusher.close()
    assert stats["buckets"] == 3 and stats["tensors"] == len(names)
    assert stats["max_bucket_bytes"] == max(sum(t.numel() * 4 for t in p.values()) for p in parts)
    assert client.weight_version() == "77" and client.weights_checksum() == weights_checksum(state)
