"""gyre_hpc.engines.launch.start_engine_on_free_port: a port taken between ``free_port`` and the engine's bind (seen
in a live SLURM run on the shared machine: "address already in use", the core cell lost) costs one more start
on another port; any other start failure raises at once. The real local engine; the taken port is a real socket.
"""
import socket

import pytest

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines import launch
from gyre_hpc.errors import EngineError

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow]

MODEL = ModelConfig()
ENGINE = EngineConfig(max_running_requests=8, context_len=256, startup_timeout_s=300.0)


def ports_starting_with(monkeypatch, first: int) -> list[int]:
    """``free_port`` answers ``first`` once, then what the OS picks; returns the ports it gave."""
    given, real = [], launch.free_port

    def free_port(host: str = "127.0.0.1") -> int:
        given.append(first if not given else real(host))
        return given[-1]

    monkeypatch.setattr(launch, "free_port", free_port)
    return given


def test_an_engine_whose_port_was_taken_starts_on_another_free_port(monkeypatch, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        given = ports_starting_with(monkeypatch, taken.getsockname()[1])
        with launch.start_engine_on_free_port(ENGINE, MODEL, log_path=tmp_path / "engine.log") as handle:
            assert len(given) == 2 and handle.url == f"http://127.0.0.1:{given[1]}"
            assert handle.client().health()
    assert launch.PORT_TAKEN in (tmp_path / "engine.log").read_text()


def test_a_start_that_fails_for_another_reason_is_not_retried(monkeypatch, tmp_path):
    given = ports_starting_with(monkeypatch, launch.free_port())
    impatient = EngineConfig(startup_timeout_s=0.01)
    with pytest.raises(EngineError, match="not ready after"):
        launch.start_engine_on_free_port(impatient, MODEL, log_path=tmp_path / "engine.log")
    assert len(given) == 1


def test_a_server_that_logs_a_failed_bind_and_hangs_fails_its_start_at_once(tmp_path):
    """A double of SGLang at the port race (a port taken after ``require_port_free`` looked): it logs uvicorn's
    bind error, then hangs in its shutdown instead of exiting. The start must fail on the log, not the timeout."""
    import sys

    double = "import sys, time; print('ERROR: [Errno 98] error while attempting to bind on address: " \
             "address already in use', flush=True); time.sleep(600)"
    with pytest.raises(EngineError, match="could not bind its port"):  # not "not ready after" the timeout
        launch.spawn_ready([sys.executable, "-c", double], f"http://127.0.0.1:{launch.free_port()}",
                           tmp_path / "server.log", timeout_s=120.0, name="cell5 (sglang double)")
