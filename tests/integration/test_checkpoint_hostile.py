"""A checkpoint is read without running code from it: a planted pickle whose payload would create a marker file is
refused with a one-line ``CheckpointError`` and the marker never appears (gyre_hpc/train/checkpoint.py)."""
import json
import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

from gyre_hpc.errors import CheckpointError
from gyre_hpc.train import checkpoint


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):  # what an attacker plants: unpickling runs os.system
        return (os.system, (f"touch {self.marker}",))


def planted(tmp_path, write_state):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"version": 3, "world_size": 1}))
    save_file({"w": torch.zeros(2)}, str(d / "rank000.safetensors"))
    write_state(d / "rank000.state.pt")
    return d


@pytest.mark.parametrize("fmt", ["torch.save", "raw pickle"])
def test_a_planted_pickle_is_refused_without_running_its_payload(tmp_path, fmt):
    marker = tmp_path / "pwned"
    evil = {"version": 3, "optimizer": Payload(marker)}
    if fmt == "torch.save":
        d = planted(tmp_path, lambda p: torch.save(evil, p))
    else:
        d = planted(tmp_path, lambda p: p.write_bytes(pickle.dumps(evil)))
    with pytest.raises(CheckpointError, match=r"rank000\.state\.pt: refused") as err:
        checkpoint.load(d)
    assert "\n" not in str(err.value)
    assert not marker.exists()


def test_a_pickle_under_the_old_rank_file_name_is_never_opened(tmp_path):
    marker = tmp_path / "pwned"
    d = planted(tmp_path, lambda p: torch.save({"version": 3, "optimizer": {}}, p))
    (d / "rank000.pt").write_bytes(pickle.dumps(Payload(marker)))
    state, meta = checkpoint.load(d)
    assert state["version"] == 3 and meta["version"] == 3
    assert not marker.exists()


def test_weights_that_are_not_safetensors_are_refused(tmp_path):
    d = planted(tmp_path, lambda p: torch.save({"version": 3}, p))
    (d / "rank000.safetensors").write_bytes(pickle.dumps({"w": 1}))
    with pytest.raises(CheckpointError, match=r"rank000\.safetensors: not a safetensors file"):
        checkpoint.load(d)


def test_a_missing_rank_file_is_a_checkpoint_error_naming_it(tmp_path):
    d = planted(tmp_path, lambda p: torch.save({"version": 3}, p))
    (d / "rank000.state.pt").unlink()
    with pytest.raises(CheckpointError, match=r"rank000\.state\.pt: missing"):
        checkpoint.load(d)
