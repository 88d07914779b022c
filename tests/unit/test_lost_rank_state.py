"""gyre_hpc.live.lost: what rank 0 saves when mpirun tears the job down because a rank died: the checkpoint
of the last step it applied (held even after the core replaced checkpoints/latest), counters consistent with
its step records, and a state ``gyre_hpc.lifecycle.resume.load`` accepts."""
import json
import os
import signal

import pytest

from gyre_hpc.lifecycle import resume
from gyre_hpc.lifecycle.recovery import StopKind
from gyre_hpc.errors import CheckpointError
from gyre_hpc.files.io import atomic_dir
from gyre_hpc.live import lost


def write_latest(run_dir, version):
    with atomic_dir(run_dir / "checkpoints" / "latest") as tmp:
        (tmp / "meta.json").write_text(json.dumps({"version": version, "world_size": 1}))
        (tmp / "rank000.safetensors").write_bytes(b"weights of version %d" % version)


def steps(lags):
    return [{"version": i + 1, "staleness_mean": lag} for i, lag in enumerate(lags)]


def state_at(version, lags, sched_version=None):
    """A snapshot whose allocator state may lag the data plane (``sched_version`` < the hub's version)."""
    sv = version if sched_version is None else sched_version
    sched = {"version": sv, "steps_done": sv, "trained_batches": sv, "lag_sum": sum(max(0.0, x) for x in lags[:sv]),
             "admitted_queries": 11}
    return {"version": version, "sched": sched, "steps": steps(lags), "next_gid": 12, "inflight": [9, 10],
            "buffer": [{"gid": 8, "tito": "tito/q00008.jsonl", "runs": 2, "trained_tokens": 0, "gen_versions": [2],
                        "ready_version": 2}], "counters": {"segments": 1}}


def test_the_held_checkpoint_is_the_applied_steps_even_after_the_core_saved_a_newer_one(tmp_path):
    write_latest(tmp_path, 2)
    assert lost.hold(tmp_path, 2)
    write_latest(tmp_path, 3)  # the core stepped again; its STEPPED never reached rank 0
    held = lost.checkpoint_for(tmp_path, 2)
    assert held == lost.held_dir(tmp_path)
    assert (held / "rank000.safetensors").read_bytes() == b"weights of version 2"
    assert lost.checkpoint_for(tmp_path, 3) == tmp_path / "checkpoints" / "latest"
    assert lost.checkpoint_for(tmp_path, 4) is None


def test_hold_refuses_a_latest_checkpoint_of_another_version(tmp_path):
    write_latest(tmp_path, 3)
    assert not lost.hold(tmp_path, 2)
    assert not lost.held_dir(tmp_path).exists()


def test_counters_rebuilt_from_the_step_records_pass_the_resume_check(tmp_path):
    write_latest(tmp_path, 2)
    lost.hold(tmp_path, 2)
    state = state_at(2, [0.5, -0.25], sched_version=1)  # the control plane had applied one step of two
    state["sched"] = lost.sched_from_steps(state["steps"], state["sched"])
    assert state["sched"] == {"version": 2, "steps_done": 2, "trained_batches": 2, "lag_sum": 0.5,
                              "lag_token_sum": 0.0, "lag_tokens": 0.0, "admitted_queries": 11,
                              "onpolicy_batches": 1, "onpolicy_tokens": 0.0}
    lost.save(tmp_path, state)
    got = resume.load(tmp_path)
    assert got["inflight"] == [9, 10] and got["buffer"][0]["ready_version"] == 2
    linked = resume.resume_dir(tmp_path) / resume.CHECKPOINT / "rank000.safetensors"
    assert os.stat(linked).st_ino == os.stat(lost.held_dir(tmp_path) / "rank000.safetensors").st_ino


def test_a_loss_before_the_core_published_saves_version_0_without_a_checkpoint(tmp_path):
    lost.save(tmp_path, state_at(0, []))
    got = resume.load(tmp_path)
    assert got["version"] == 0 and got["inflight"] == [9, 10] and not resume.has_checkpoint(tmp_path)


def test_a_loss_after_a_step_without_its_checkpoint_is_refused_and_writes_nothing(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint of version 1"):
        lost.save(tmp_path, state_at(1, [0.0]))
    assert not resume.resume_dir(tmp_path).exists()


def test_teardown_notes_mpiruns_sigterm_instead_of_dying():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        teardown = lost.Teardown().install()
        assert not teardown.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert teardown.requested and teardown.reason().kind is StopKind.RANK_LOST
        assert teardown.reason().detail.startswith("SIGTERM")
    finally:
        signal.signal(signal.SIGTERM, previous)
