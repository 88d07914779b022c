"""An SGLang server that cannot start: ``start_engine`` raises ``EngineError`` naming the engine (the cell); what
can be seen before the server starts (no weights, a port in use) is refused at once, without starting it. (A real
server that fails while it starts, with its log's tail in the error and no scratch left holding the job secret:
tests/integration/test_sglang_live.py.)"""
from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.launch import on_free_port, start_engine
from gyre_hpc.errors import EngineError

# no `sglang` marker: these refusals come before any server starts (they need the package installed, as CI does)
pytestmark = [pytest.mark.slow]


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


def test_a_model_directory_without_weights_is_refused_before_the_server_starts(tmp_path, temp_root):
    from gyre_hpc.models.init import init_model

    model = init_model("qwen3", tmp_path / "broken", head_dim=16, ffn=128)
    (model / "model.safetensors").unlink()
    log = tmp_path / "engine.log"
    with pytest.raises(EngineError, match=r"cell3 \(sglang\): engine.model_path=.*broken' holds no model weights "
                                          r"\(\*\.safetensors, \*\.bin, \*\.pt\)"):
        on_free_port(start_engine, _cfg(model), ModelConfig(), log_path=log, name="cell3")
    # said at once: SGLang would find no weights only after importing itself, a minute or two on CPU
    assert not log.exists() and not list(temp_root.glob("gyre-*"))


def test_a_model_path_that_is_not_a_directory_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(EngineError, match=r"cell1 \(sglang\).*is not a directory"):
        on_free_port(start_engine, _cfg(tmp_path / "missing"), ModelConfig(), name="cell1")


def test_a_port_in_use_fails_with_the_cell_name_and_the_bind_error_before_the_server_starts(tmp_path):
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
    # said at once: SGLang would have bound the port only after loading the model (a minute on CPU)
    assert not (tmp_path / "engine.log").exists()
