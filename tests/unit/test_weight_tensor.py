"""The tensor road's payload (gyre_hpc.engines.weight_tensor): SGLang's serialization, read back by a restricted
unpickler."""
import io
import os
import pickle

import pytest
import torch

from gyre_hpc.engines.weight_tensor import deserialize, serialize
from gyre_hpc.errors import EngineError

pytestmark = pytest.mark.megatron  # needs torch


def test_named_tensors_round_trip_with_their_names_dtypes_shapes_and_values():
    named = [("a.weight", torch.arange(12, dtype=torch.float32).reshape(3, 4)),
             ("b.bias", torch.ones(5, dtype=torch.bfloat16)), ("empty", torch.zeros(0))]
    back = deserialize(serialize(named))
    assert [n for n, _ in back] == ["a.weight", "b.bias", "empty"]
    for (_, t), (_, u) in zip(named, back):
        assert u.dtype == t.dtype and u.shape == t.shape and torch.equal(u, t)


def test_the_payload_holds_shared_file_names_not_the_tensor_bytes():
    big = torch.zeros(1 << 20)  # 4 MiB
    assert len(serialize([("big", big)])) < 4096
    assert big.is_shared()


def test_the_sharing_strategy_is_restored_after_serializing():
    import torch.multiprocessing as tmp

    before = tmp.get_sharing_strategy()
    serialize([("x", torch.ones(2))])
    assert tmp.get_sharing_strategy() == before


def test_a_pickle_naming_any_other_global_is_refused_with_a_400_naming_it():
    buf = io.BytesIO()
    pickle.dump([("x", os.system)], buf)
    with pytest.raises(EngineError, match="posix.system is not allowed") as err:
        deserialize(buf.getvalue())
    assert err.value.status == 400


def test_a_payload_that_is_not_a_list_of_name_tensor_pairs_is_refused():
    with pytest.raises(EngineError, match="list of \\(name, tensor\\) pairs"):
        deserialize(pickle.dumps({"x": 1}))
    with pytest.raises(EngineError):
        deserialize(b"not a pickle")


def test_engine_weight_road_picks_the_pusher():
    from gyre_hpc.config import EngineConfig
    from gyre_hpc.engines.weight_sync import WeightPusher
    from gyre_hpc.engines.weight_tensor import TensorPusher, make_pusher

    client = object()  # the pushers only keep it until a push
    assert type(make_pusher(EngineConfig(), client)) is WeightPusher
    assert type(make_pusher(EngineConfig(weight_road="tensor"), client)) is TensorPusher
