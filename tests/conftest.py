"""Fixtures shared by tests/unit and tests/integration (issue 14): the pieces several test files built by hand.

- ``tiny_model``: the embedded CPU default ``ModelConfig()`` (vocab 256, hidden 64, 2 layers).
- ``run_dir``: an empty run directory, ``tmp_path / "run"``.
- ``local_engine``: a factory that starts real local engines (``start_local_engine`` on a free loopback port,
  another one if the bind lost a race: ``on_free_port``; the log beside the test) and stops every one it started
  when the test ends, also when the test failed.
- ``spawn_ranks``: runs ``target(*args, queue)`` in one spawned process per argument tuple, returns what the first
  rank put on the queue and every exit code; a process still alive when the test ends is killed.

Tests marked ``waits`` (most of their time is a wait on an outside clock: SLURM's time limit) are collected
first, then those marked ``sglang`` (a real SGLang server starts in 1-2.5 minutes on these CPUs, their modules are
the longest live ones), so that xdist (``--dist loadfile`` hands out modules in collection order) starts them
first and they overlap the other tests instead of ending the run alone on one worker (scripts/test.sh passes
``--no-loadscope-reorder`` for that group: by default xdist 3.8 reorders modules by their number of tests).

Invariant: importing this file imports only the standard library and pytest (the heavy modules are imported inside
the fixtures), so the pure unit tests stay light.
"""
from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # stable: within each class the tests keep their order
    items.sort(key=lambda item: (item.get_closest_marker("waits") is None, item.get_closest_marker("sglang") is None))


@pytest.fixture
def tiny_model():
    from gyre_hpc.config import ModelConfig

    return ModelConfig()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture
def local_engine(tmp_path: Path, tiny_model):
    """``start(engine_cfg, model_cfg=tiny_model, seed=0, **kw) -> EngineHandle``; all stopped at teardown."""
    from gyre_hpc.engines.launch import on_free_port, start_local_engine

    handles = []

    def start(engine_cfg, model_cfg=None, seed: int = 0, **kw):
        log = tmp_path / f"engine{len(handles)}.log"
        handle = on_free_port(start_local_engine, engine_cfg, model_cfg or tiny_model, seed=seed,
                              log_path=log, **kw)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


@pytest.fixture
def spawn_ranks():
    """``run(target, [args of rank 0, args of rank 1, ...], timeout=180) -> (rank 0's queue item, exit codes)``."""
    started = []

    def run(target, rank_args, timeout: float = 180.0):
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=target, args=(*args, queue)) for args in rank_args]
        started.extend(procs)
        for p in procs:
            p.start()
        got = queue.get(timeout=timeout)
        for p in procs:
            p.join(timeout=60)
        return got, [p.exitcode for p in procs]

    yield run
    for p in started:
        if p.is_alive():
            p.kill()
            p.join(timeout=10)
