"""Atomic outputs: the target is either the old or the new content, never partial; run dirs are unique."""
import os

import pytest

from gyre_hpc.files.io import atomic_dir, atomic_write_json, atomic_write_text, make_run_dir


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    p = tmp_path / "a.txt"
    atomic_write_text(p, "old")
    atomic_write_text(p, "new")
    assert p.read_text() == "new"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_failed_atomic_dir_keeps_previous_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    with atomic_dir(ckpt) as d:
        (d / "w.bin").write_text("v1")
    with pytest.raises(RuntimeError):
        with atomic_dir(ckpt) as d:
            (d / "w.bin").write_text("half")
            raise RuntimeError("killed mid-write")
    assert (ckpt / "w.bin").read_text() == "v1"
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_atomic_dir_replaces_existing(tmp_path):
    ckpt = tmp_path / "ckpt"
    for v in ("v1", "v2"):
        with atomic_dir(ckpt) as d:
            (d / "w.bin").write_text(v)
    assert (ckpt / "w.bin").read_text() == "v2"
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_run_dirs_are_unique(tmp_path):
    a, b = make_run_dir(tmp_path, "x"), make_run_dir(tmp_path, "x")
    assert a != b and a.is_dir() and b.is_dir()


def test_atomic_json_is_readable(tmp_path):
    import json

    p = atomic_write_json(tmp_path / "m.json", {"b": 1, "a": [1, 2]})
    assert json.loads(p.read_text()) == {"a": [1, 2], "b": 1}


def test_atomic_write_gives_ordinary_permissions(tmp_path):
    p = atomic_write_text(tmp_path / "a.txt", "x")
    mask = os.umask(0)
    os.umask(mask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~mask
