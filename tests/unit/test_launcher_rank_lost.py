"""``gyre train``'s launcher after mpirun ended without a summary (jobs/train.py ``_failed``): a lost rank is
``rank_lost`` with exit 69, and the resume state this segment's rank 0 saved (event ``lost_rank_saved``) is named in
the event and the message, and so is rank 0's periodic state (event ``resume_saved``) when rank 0 itself died;
one an earlier segment saved is not."""
import json

from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.config import load_config
from gyre_hpc.lifecycle.recovery import RANK_LOST_EXIT
from jobs.train import _failed


def events(run_dir, *records):
    with open(run_dir / "events.jsonl", "a") as f:
        for r in records:
            f.write(json.dumps({"t": 1.0, "wall": 2.0, **r}) + "\n")


def test_a_lost_rank_with_a_saved_state_names_it_and_exits_69(tmp_path, capsys):
    events(tmp_path, {"event": "start"}, {"event": "lost_rank_saved", "resume": str(tmp_path / "resume")},
           {"event": "stop"})
    assert _failed(load_config(None), tmp_path, 137) == RANK_LOST_EXIT
    last = read_events(tmp_path / "events.jsonl")[-1]
    assert last["event"] == "rank_lost" and last["resume"] == str(tmp_path / "resume")
    assert f"--resume {tmp_path}" in capsys.readouterr().err


def test_a_state_an_earlier_segment_saved_is_not_this_segments(tmp_path, capsys):
    events(tmp_path, {"event": "start"}, {"event": "lost_rank_saved", "resume": str(tmp_path / "resume")},
           {"event": "rank_lost"}, {"event": "start"}, {"event": "resumed"})
    assert _failed(load_config(None), tmp_path, 137, before=3) == RANK_LOST_EXIT
    assert read_events(tmp_path / "events.jsonl")[-1]["resume"] is None
    assert "--resume" not in capsys.readouterr().err


def test_rank_0_dead_after_a_periodic_save_names_that_state(tmp_path, capsys):
    (tmp_path / "resume").mkdir()
    (tmp_path / "resume" / "state.json").write_text("{}")
    events(tmp_path, {"event": "resumed", "steps_done": 1}, {"event": "resume_saved", "steps_done": 2})
    assert _failed(load_config(None), tmp_path, 137) == RANK_LOST_EXIT
    assert read_events(tmp_path / "events.jsonl")[-1]["resume"] == str(tmp_path / "resume")
    assert f"--resume {tmp_path}" in capsys.readouterr().err


def test_a_periodic_state_no_newer_than_the_segments_start_is_not_named(tmp_path, capsys):
    (tmp_path / "resume").mkdir()
    (tmp_path / "resume" / "state.json").write_text("{}")
    events(tmp_path, {"event": "resumed", "steps_done": 2}, {"event": "resume_saved", "steps_done": 2})
    _failed(load_config(None), tmp_path, 137)
    assert read_events(tmp_path / "events.jsonl")[-1]["resume"] is None
    assert "--resume" not in capsys.readouterr().err
