"""Engines and the proxy leave nothing in the temporary directory: the files a start writes where the caller named
no place (the config, the log) live in the handle's private scratch directory, which ``stop()`` removes, also
when the start failed. (Before, every engine start of a live run left an ``gyre-engine-*`` directory behind.)"""
from __future__ import annotations

import tempfile

import pytest

from gyre_hpc.config import EngineConfig, ModelConfig, ProxyConfig
from gyre_hpc.engines.launch import on_free_port, start_local_engine
from gyre_hpc.errors import EngineError

pytestmark = [pytest.mark.megatron]

ENGINE = EngineConfig(max_running_requests=2, context_len=256, startup_timeout_s=180.0)


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """This process's temporary directory, empty, for the test alone."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def ours(root) -> list:
    """What gyre left in ``root`` (torch may add its own caches there)."""
    return sorted(root.glob("gyre-*"))


def test_a_local_engine_keeps_its_config_and_log_in_a_private_scratch_that_stop_removes(temp_root):
    handle = on_free_port(start_local_engine, ENGINE, ModelConfig())
    try:
        assert handle.scratch is not None and handle.scratch.parent == temp_root
        assert handle.scratch.stat().st_mode & 0o077 == 0  # private: no one else reads the config
        assert sorted(p.name for p in handle.scratch.iterdir()) == [f"engine-{handle.url.rsplit(':', 1)[1]}.yaml",
                                                                    "process.log"]
        assert handle.log_path == handle.scratch / "process.log"
    finally:
        handle.stop()
    assert not ours(temp_root)


def test_a_local_engine_that_cannot_start_raises_with_its_log_and_leaves_nothing(temp_root):
    too_long = EngineConfig(context_len=ModelConfig().max_seq_len + 1, startup_timeout_s=180.0)
    gone = r"(?s)exited with 2 before it was ready; its log \(removed with the process\):.*exceeds model.max_seq_len"
    with pytest.raises(EngineError, match=gone):
        on_free_port(start_local_engine, too_long, ModelConfig())
    assert not ours(temp_root)


def test_a_caller_that_names_the_places_gets_its_files_there_and_they_stay(temp_root, tmp_path):
    handle = on_free_port(start_local_engine, ENGINE, ModelConfig(), log_path=tmp_path / "e.log",
                          config_dir=tmp_path)
    handle.stop()
    assert handle.scratch is None and not ours(temp_root)
    assert (tmp_path / "e.log").is_file() and (tmp_path / "e.yaml").is_file()  # the config is named after its log


def test_the_proxy_keeps_its_config_and_log_in_a_scratch_that_stop_removes(temp_root):
    from gyre_hpc.proxy.launch import start_proxy

    proxy = on_free_port(start_proxy, ProxyConfig())
    try:
        assert proxy.scratch is not None and proxy.scratch.parent == temp_root
        assert proxy.log_path.parent == proxy.scratch and proxy.log_path.is_file()
    finally:
        proxy.stop()
    assert not ours(temp_root)
