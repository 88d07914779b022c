"""gyre_hpc.rundir: a run directory and its config.yaml, written atomically, kept once written, read back equal."""
import os

import pytest
import yaml

from gyre_hpc.config import load_config, to_dict
from gyre_hpc.errors import ConfigError
from gyre_hpc.rundir import RunDir

CONFIG = "configs/local.yaml"


def test_a_new_run_directory_holds_the_config_and_reads_it_back_equal(tmp_path):
    cfg = load_config(CONFIG, ["allocator.steps=7", f"run.out_dir={tmp_path}"])
    rundir = RunDir.new(cfg.run.out_dir, cfg.run.name)
    assert rundir.fresh and rundir.path.parent == tmp_path and rundir.path.name.startswith(f"{cfg.run.name}-")
    assert rundir.write_config(cfg) == rundir.path / "config.yaml"
    assert rundir.read_config() == cfg
    assert rundir.saved_config() == to_dict(cfg)
    assert sorted(p.name for p in rundir.path.iterdir()) == ["config.yaml"]  # no temporary file left


def test_two_new_run_directories_of_one_name_never_share_a_path(tmp_path):
    a, b = RunDir.new(tmp_path, "x"), RunDir.new(tmp_path, "x", absolute=True)
    assert a.path != b.path and b.path.is_absolute()


def test_keep_config_never_replaces_the_config_written_before(tmp_path):
    first, second = load_config(CONFIG, ["allocator.steps=3"]), load_config(CONFIG, ["allocator.steps=9"])
    rundir = RunDir.at(tmp_path / "run")
    assert rundir.saved_config() is None
    rundir.keep_config(first)
    rundir.keep_config(second)
    assert rundir.read_config() == first


def test_a_failed_write_leaves_the_earlier_config_and_no_temporary_file(tmp_path, monkeypatch):
    first = load_config(CONFIG, ["allocator.steps=3"])
    rundir = RunDir.at(tmp_path)
    rundir.write_config(first)

    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(ConfigError, match=r"run.out_dir: cannot write .*config.yaml \(No space left on device\)"):
        rundir.write_config(load_config(CONFIG, ["allocator.steps=9"]))
    monkeypatch.undo()
    assert yaml.safe_load(rundir.config_path.read_text()) == to_dict(first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_a_new_directory_whose_config_cannot_be_written_is_removed(tmp_path):
    rundir = RunDir.new(tmp_path, "x")
    (rundir.path / "config.yaml").mkdir()  # something in the way
    with pytest.raises(ConfigError, match="run.out_dir"):
        rundir.write_config(load_config(CONFIG))
    assert not rundir.path.exists()


def test_a_directory_the_run_did_not_make_is_kept_when_its_config_cannot_be_written(tmp_path):
    (tmp_path / "config.yaml").mkdir()
    with pytest.raises(ConfigError, match="run.out_dir"):
        RunDir.at(tmp_path).write_config(load_config(CONFIG))
    assert (tmp_path / "config.yaml").is_dir()


def test_reading_a_run_directory_without_a_config_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config.yaml: no config"):
        RunDir(tmp_path).read_config()
