"""``/admin/flush_tito`` writes only inside the run's TITO directory (gyre_hpc/proxy/recorder.py::tito_file)."""
from __future__ import annotations

import os

import pytest

from gyre_hpc.proxy.recorder import TitoRecorder, group_file, tito_file
from gyre_hpc.proxy.routing import ProxyError


def test_a_plain_file_name_lands_in_the_tito_dir(tmp_path):
    assert tito_file(tmp_path, "q00003.jsonl") == tmp_path / "q00003.jsonl"
    assert tito_file(tmp_path, group_file(7)) == tmp_path / "q00007.jsonl"


@pytest.mark.parametrize("name", ["../x.jsonl", "/etc/passwd", "a/b.jsonl", "..", ".hidden.jsonl", "x.json",
                                  "x.jsonl\n", "", None, 3, ["q.jsonl"], "x" * 70 + ".jsonl"])
def test_anything_but_a_plain_file_name_is_refused_naming_the_key(tmp_path, name):
    with pytest.raises(ProxyError, match="^name: ") as err:
        tito_file(tmp_path, name)
    assert err.value.status == 400


def test_no_tito_dir_means_no_flush(tmp_path):
    with pytest.raises(ProxyError, match="proxy.tito_dir") as err:
        tito_file(None, "q00001.jsonl")
    assert err.value.status == 409


def test_a_symbolic_link_is_never_written_through(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    os.chmod(target, 0o600)
    tito = tmp_path / "tito"
    tito.mkdir()
    (tito / "q00001.jsonl").symlink_to(target)
    with pytest.raises(ProxyError, match="symbolic link"):
        tito_file(tito, "q00001.jsonl")
    linked_dir = tmp_path / "linked"
    linked_dir.symlink_to(tito)
    with pytest.raises(ProxyError, match="symbolic link"):
        tito_file(linked_dir, "q00002.jsonl")
    assert target.read_text() == "keep\n" and oct(target.stat().st_mode & 0o777) == "0o600"


def test_an_empty_flush_into_the_tito_dir_creates_only_that_file(tmp_path):
    out = TitoRecorder().flush(tito_file(tmp_path, "q00000.jsonl"))
    assert out == {"path": str(tmp_path / "q00000.jsonl"), "calls": 0, "outcomes": 0, "runs": [],
                   "served": {}, "recovered": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q00000.jsonl"]
