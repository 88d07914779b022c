"""A real SGLang server that cannot start: ``start_engine`` raises ``EngineError`` naming the engine (the cell) and
showing the tail of the server's log, and leaves no process behind, and no file holding the job secret."""
from __future__ import annotations

import re
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.launch import on_free_port, start_engine
from gyre_hpc.errors import EngineError

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def _cfg(model_path) -> EngineConfig:
    return EngineConfig(kind="sglang", model_path=str(model_path), max_running_requests=2, context_len=256,
                        startup_timeout_s=600.0)


@pytest.fixture
def temp_root(monkeypatch):
    """This process's temporary directory for the test alone: where a start's scratch goes (SGLang's 0600 api-key
    config, its TMPDIR). Short, as SGLang's ipc sockets live there (``launch.SGLANG_TMPDIR_MAX``)."""
    root = Path(tempfile.mkdtemp(prefix="gyre-test-"))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_model_directory_without_weights_fails_with_the_cell_name_and_the_server_log_tail(tmp_path, temp_root):
    from gyre_hpc.models.init import init_model

    model = init_model("qwen3", tmp_path / "broken", head_dim=16, ffn=128)
    (model / "model.safetensors").unlink()
    log = tmp_path / "engine.log"
    with pytest.raises(EngineError) as err:
        on_free_port(start_engine, _cfg(model), ModelConfig(), log_path=log, name="cell3")
    message = str(err.value)
    assert re.match(r"cell3 \(sglang on (cpu|cuda)\) at http://127\.0\.0\.1:\d+ exited with", message)
    tail = log.read_text(errors="replace").strip().splitlines()[-1]
    assert tail in message and "Cannot find any model weights" in message  # the log's tail is shown, with the cause
    assert not list(temp_root.glob("gyre-*"))  # the scratch with the api-key config went with the failed server


def test_a_model_path_that_is_not_a_directory_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(EngineError, match=r"cell1 \(sglang\).*is not a directory"):
        on_free_port(start_engine, _cfg(tmp_path / "missing"), ModelConfig(), name="cell1")


def test_a_port_in_use_fails_with_the_cell_name_and_the_bind_error(tmp_path):
    from gyre_hpc.models.init import init_model

    model = init_model("qwen3", tmp_path / "model", head_dim=16, ffn=128)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EngineError) as err:
            start_engine(_cfg(model), ModelConfig(), port=port, log_path=tmp_path / "engine.log", name="cell4")
    message = str(err.value)
    assert message.startswith("cell4 (sglang on ") and f":{port} " in message
    assert "address already in use" in message
