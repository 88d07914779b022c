"""gyre_hpc.lifecycle.resume: the resume state of a preempted run is written whole, checked on load, and restores the
staleness bookkeeping exactly."""
import json
import os

import pytest

from gyre_hpc.lifecycle import resume
from gyre_hpc.allocator.state import CellState, SchedState
from gyre_hpc.allocator.staleness import admission_window
from gyre_hpc.errors import CheckpointError


def checkpoint(tmp_path, version, name="ckpt"):
    d = tmp_path / name
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"version": version, "world_size": 1}))
    (d / "rank000.pt").write_bytes(b"weights+optimizer of version %d" % version)
    return d


def state(version=2, lags=(0.5, 1.25)):
    steps = [{"version": i + 1, "staleness_mean": lag} for i, lag in enumerate(lags)]
    sched = {"version": version, "steps_done": version, "trained_batches": len(lags), "lag_sum": sum(lags),
             "admitted_queries": 9}
    buffer = [{"gid": 7, "tito": "tito/q00007.jsonl", "runs": 4, "trained_tokens": 30, "gen_versions": [1, 2]}]
    return {"version": version, "sched": sched, "steps": steps, "buffer": buffer, "next_gid": 9,
            "counters": {"segments": 1}}


def test_saved_state_loads_back_with_the_checkpoint_linked_beside_it(tmp_path):
    ckpt = checkpoint(tmp_path, 2)
    resume.save(tmp_path / "run", state(), ckpt)
    got = resume.load(tmp_path / "run")
    assert got["sched"]["lag_sum"] == 1.75 and got["buffer"][0]["gen_versions"] == [1, 2]
    linked = tmp_path / "run" / "resume" / "checkpoint" / "rank000.pt"
    assert linked.read_bytes() == b"weights+optimizer of version 2"
    assert os.stat(linked).st_ino == os.stat(ckpt / "rank000.pt").st_ino  # a hard link, not a copy


def test_a_failure_while_writing_leaves_the_previous_resume_state_whole(tmp_path, monkeypatch):
    resume.save(tmp_path / "run", state(), checkpoint(tmp_path, 2))
    newer = checkpoint(tmp_path, 3, "ckpt3")

    def dies(src, dst):
        raise OSError("killed while linking")

    monkeypatch.setattr(resume.os, "link", dies)
    with pytest.raises(OSError):
        resume.save(tmp_path / "run", state(3, (0.5, 1.25, 2.0)), newer)
    got = resume.load(tmp_path / "run")
    assert got["version"] == 2
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["resume"]  # no temporary sibling left


def test_a_checkpoint_of_another_version_is_refused_at_save_and_at_load(tmp_path):
    with pytest.raises(CheckpointError, match="holds version 3, the resume state is version 2"):
        resume.save(tmp_path / "run", state(), checkpoint(tmp_path, 3))
    resume.save(tmp_path / "run", state(), checkpoint(tmp_path, 2, "c2"))
    (tmp_path / "run" / "resume" / "checkpoint" / "meta.json").unlink()
    with pytest.raises(CheckpointError, match="checkpoint: holds version None"):
        resume.load(tmp_path / "run")


@pytest.mark.parametrize("edit,match", [
    (lambda s: s["sched"].update(lag_sum=9.0), "sched.lag_sum 9.0"),
    (lambda s: s["steps"].pop(), "1 step records disagree"),
    (lambda s: s["sched"].pop("trained_batches"), "sched.trained_batches is missing"),
    (lambda s: s["buffer"][0].pop("tito"), r"buffer\[0\].tito is missing"),
    (lambda s: s.update(format=99), "format: 99"),
])
def test_an_inconsistent_state_is_a_checkpoint_error_naming_file_and_key(tmp_path, edit, match):
    resume.save(tmp_path / "run", state(), checkpoint(tmp_path, 2))
    path = tmp_path / "run" / "resume" / "state.json"
    s = json.loads(path.read_text())
    edit(s)
    path.write_text(json.dumps(s))
    with pytest.raises(CheckpointError, match=match) as err:
        resume.load(tmp_path / "run")
    assert str(path) in str(err.value)


def test_no_resume_state_is_a_clear_error(tmp_path):
    assert not resume.exists(tmp_path)
    with pytest.raises(CheckpointError, match="no resume state"):
        resume.load(tmp_path)


def test_restored_counters_give_the_same_admission_window_and_count_the_buffer_as_ready():
    before = SchedState(cells=[CellState() for _ in range(2)], version=5, steps_done=5, trained_batches=5,
                        lag_sum=7.5, admitted_queries=40, inflight_groups=3, ready_groups=2)
    saved = json.loads(json.dumps(resume.sched_snapshot(before)))
    after = SchedState(cells=[CellState() for _ in range(2)])
    resume.restore_sched(after, saved, buffered=2, backlog_work_s=0.5, now=10.0)
    assert resume.sched_snapshot(after) == resume.sched_snapshot(before)
    for target in (0.5, 1.0, 2.0):
        assert admission_window(after, 4, target, 0.5, 32) == admission_window(before, 4, target, 0.5, 32)
    assert (after.ready_groups, after.unprocessed_groups, after.inflight_groups) == (2, 2, 0)
    assert after.ready_since(2) == 10.0 and after.backlog_work_s == 0.5


def test_a_key_added_since_the_run_saved_its_config_is_no_change_at_its_default():
    defaults = {"sim": {"load_model": "runs", "engine_slots": None}}
    saved = {"sim": {}}  # written by a gyre that had neither key
    assert resume.config_changes(saved, {"sim": {"load_model": "runs", "engine_slots": None}}, defaults) == {}
    assert resume.config_changes(saved, {"sim": {"load_model": "calls", "engine_slots": None}}, defaults) == {
        "sim.load_model": ("<absent>", "calls")}  # a non-default value changes what the run did: refused
    assert resume.config_changes(saved, {"sim": {"load_model": "runs"}}) == {"sim.load_model": ("<absent>", "runs")}


def test_config_changes_name_every_differing_key_except_those_a_resume_may_change():
    from gyre_hpc.config import load_config, to_dict

    saved = to_dict(load_config("configs/local.yaml", ["allocator.steps=4", "model.hidden=64"]))
    now = to_dict(load_config("configs/local.yaml", [
        "allocator.steps=8", "run.name=other", "engine.startup_timeout_s=900", "slurm.time=02:00:00",
        "engine.connect_retries=9", "model.hidden=32", "scheduler.policy=async", "agent.turns=[1, 2]"]))
    assert resume.config_changes(saved, now) == {"agent.turns": ([1, 3], [1, 2]), "model.hidden": (64, 32),
                                                 "scheduler.policy": ("gyre", "async")}
    assert resume.config_changes(saved, saved) == {}


def test_a_key_missing_on_one_side_is_a_change():
    assert resume.config_changes({"model": {"hidden": 64}}, {"model": {}}) == {"model.hidden": (64, "<absent>")}


def test_resuming_with_another_config_fails_before_any_process_starts_naming_the_keys(tmp_path):
    import yaml

    from gyre_hpc.config import load_config, to_dict
    from gyre_hpc.errors import ConfigError
    from gyre_hpc.live.rank import check_resume_config

    run = tmp_path / "run"
    resume.save(run, state(), checkpoint(tmp_path, 2))
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(load_config("configs/local.yaml", []))))
    check_resume_config(load_config("configs/local.yaml", ["allocator.steps=20"]), run)  # more steps: fine
    lr = load_config("configs/local.yaml", []).train.lr
    with pytest.raises(ConfigError, match=rf"config.yaml: .*train.lr: {lr} there, 0.5 now"):
        check_resume_config(load_config("configs/local.yaml", ["train.lr=0.5", "allocator.steps=20"]), run)


def rank_files(ckpt, ranks=1):
    """Files with the headers of their formats (a safetensors JSON header, torch.save's zip container)."""
    header = b'{"__metadata__":{}}'
    for r in range(ranks):
        (ckpt / f"rank{r:03d}.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
        (ckpt / f"rank{r:03d}.state.pt").write_bytes(b"PK\x03\x04" + b"\0" * 60)


def test_check_files_refuses_a_rank_file_that_is_not_of_its_format(tmp_path):
    ckpt = checkpoint(tmp_path, 0)
    rank_files(ckpt)
    (ckpt / "rank000.safetensors").write_bytes(b"\xff" * 16)
    resume.save(tmp_path / "run", state(0, ()) | {"buffer": []}, ckpt)
    with pytest.raises(CheckpointError, match=r"rank000\.safetensors: not a safetensors file"):
        resume.check_files(tmp_path / "run", resume.load(tmp_path / "run"))


def test_check_files_names_the_first_missing_rank_file_of_the_checkpoint(tmp_path):
    ckpt = checkpoint(tmp_path, 2)
    rank_files(ckpt)
    (tmp_path / "tito").mkdir()
    s = state()
    s["buffer"][0]["tito"] = str(tmp_path / "tito" / "q00007.jsonl")
    (tmp_path / "tito" / "q00007.jsonl").write_text("{}\n")
    resume.save(tmp_path / "run", s, ckpt)
    got = resume.load(tmp_path / "run")
    resume.check_files(tmp_path / "run", got)  # complete: no error
    (tmp_path / "run" / "resume" / "checkpoint" / "rank000.state.pt").unlink()
    with pytest.raises(CheckpointError, match=r"rank000\.state\.pt: missing"):
        resume.check_files(tmp_path / "run", got)


def test_check_files_names_a_missing_trajectory_file_of_the_buffer(tmp_path):
    ckpt = checkpoint(tmp_path, 2)
    rank_files(ckpt)
    resume.save(tmp_path / "run", state(), ckpt)
    with pytest.raises(CheckpointError, match=r"q00007\.jsonl: missing"):
        resume.check_files(tmp_path / "run", resume.load(tmp_path / "run"))


def test_the_empty_state_loads_without_a_checkpoint_and_needs_only_itself(tmp_path):
    resume.save_empty(tmp_path / "run")
    got = resume.load(tmp_path / "run")
    assert (got["version"], got["steps"], got["buffer"], got["inflight"]) == (0, [], [], [])
    assert not resume.has_checkpoint(tmp_path / "run")
    assert resume.needed_files(tmp_path / "run", got) == [tmp_path / "run" / "resume" / "state.json"]


def test_a_state_of_version_one_or_more_without_its_checkpoint_is_refused(tmp_path):
    resume.save(tmp_path / "run", state(), checkpoint(tmp_path, 2))
    import shutil

    shutil.rmtree(tmp_path / "run" / "resume" / "checkpoint")
    with pytest.raises(CheckpointError, match="holds version None"):
        resume.load(tmp_path / "run")


def test_the_in_flight_policy_may_change_across_a_resume():
    assert resume.config_changes({"allocator": {"preempt_inflight": "reissue"}},
                                 {"allocator": {"preempt_inflight": "drop"}}) == {}
