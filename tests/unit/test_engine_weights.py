"""The weights directory /update_weights_from_disk loads: atomic, checksummed, refuses corrupt or foreign files."""
import json

import pytest
import torch

from gyre_hpc.engines.weights import load_weights_dir, save_weights, weights_checksum
from gyre_hpc.errors import EngineError

pytestmark = pytest.mark.megatron  # needs torch


def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(4, 3, generator=g), "b.weight": torch.randn(5, generator=g),
            "c.bf16": torch.randn(2, 2, generator=g).to(torch.bfloat16), "d.scalar": torch.tensor(1.5)}


def test_save_then_load_round_trips_bit_exactly(tmp_path):
    state = _state()
    path = save_weights(tmp_path / "w", state, "7")
    loaded, meta = load_weights_dir(path)
    assert meta["weight_version"] == "7" and meta["checksum"] == weights_checksum(state)
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], state[k]) for k in state)
    assert meta["tensors"]["c.bf16"] == ["bfloat16", [2, 2]]


def test_checksum_ignores_order_and_sees_every_byte_name_and_dtype():
    state = _state()
    assert weights_checksum(dict(reversed(list(state.items())))) == weights_checksum(state)
    flipped = {**state, "b.weight": state["b.weight"].clone()}
    flipped["b.weight"][3] = torch.nextafter(flipped["b.weight"][3], torch.tensor(10.0))
    renamed = {("z" if k == "a.weight" else k): v for k, v in state.items()}
    recast = {**state, "b.weight": state["b.weight"].double()}
    sums = {weights_checksum(s) for s in (state, flipped, renamed, recast)}
    assert len(sums) == 4


def test_corrupt_missing_or_foreign_directories_are_refused(tmp_path):
    with pytest.raises(EngineError, match="not a weights directory"):
        load_weights_dir(tmp_path / "nothing")
    path = save_weights(tmp_path / "w", _state(), "1")
    torch.save(_state(seed=1), path / "weights.pt")  # tensors no longer match meta.json
    with pytest.raises(EngineError, match="checksum") as err:
        load_weights_dir(path)
    assert err.value.status == 400
    path = save_weights(tmp_path / "w2", _state(), "1")
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "format": "hf"}))
    with pytest.raises(EngineError, match="format"):
        load_weights_dir(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(EngineError, match=r"meta.json:1"):
        load_weights_dir(path)


def test_a_save_failing_mid_write_leaves_the_previous_directory_whole(tmp_path, monkeypatch):
    path = save_weights(tmp_path / "w", _state(), "1")

    def disk_full(obj, f):
        open(f, "wb").write(b"half a tensor")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space"):
        save_weights(tmp_path / "w", _state(seed=2), "2")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]
    state, meta = load_weights_dir(path)
    assert meta["weight_version"] == "1" and weights_checksum(state) == weights_checksum(_state())
