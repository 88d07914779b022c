"""Fixtures shared by tests/unit and tests/integration (issue 14): the pieces several test files built by hand.

- ``tiny_model``: the embedded CPU default ``ModelConfig()`` (vocab 256, hidden 64, 2 layers).
- ``run_dir``: an empty run directory, ``tmp_path / "run"``.
- ``local_engine``: a factory that starts real local engines (``start_local_engine`` on a free loopback port,
  another one if the bind lost a race: ``on_free_port``; the log beside the test) and stops every one it started
  when the test ends, also when the test failed.
- ``spawn_ranks``: runs ``target(*args, queue)`` in one spawned process per argument tuple, returns what the first
  rank put on the queue and every exit code; a process still alive when the test ends is killed.

With ``--dist loadgroup`` (scripts/test.sh's mpi/SLURM group: two xdist workers) every test is put in an
``xdist_group``: the SLURM tests in one (one worker runs them one after another: they share the 4-node cluster),
each other module in its own (it stays whole on one worker, so its module fixtures start once).

Invariant: importing this file imports only the standard library and pytest (the heavy modules are imported inside
the fixtures), so the pure unit tests stay light.
"""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # what xdist sets for --dist loadgroup, on its workers too
        return
    for item in items:
        slurm = item.get_closest_marker("slurm") is not None
        item.add_marker(pytest.mark.xdist_group("slurm" if slurm else item.nodeid.split("::")[0]))


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
