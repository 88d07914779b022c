"""gyre_hpc.live.supervise: when ``gyre train`` relaunches its run, and what it records (the launch itself is a
double here: a function that writes what a segment's rank 0 and ``_failed`` would write; the live relaunch is
tests/integration/test_relaunch.py)."""
import json

import pytest

from gyre_hpc.errors import ConfigError
from gyre_hpc.lifecycle import recovery
from gyre_hpc.lifecycle.recovery import PREEMPTED_EXIT, LaunchSegment, relaunch_reason
from gyre_hpc.live import supervise


def seg(exit=69, saved=True, resume_state=True, resumed=False, preempted=False, stepped=True,
        checkpointed=False, started=True) -> LaunchSegment:
    return LaunchSegment(exit=exit, saved=saved, resume_state=resume_state, resumed=resumed, preempted=preempted,
                   stepped=stepped, checkpointed=checkpointed, started=started)


def test_a_lost_rank_with_its_resume_state_saved_is_relaunched_while_the_budget_lasts():
    assert relaunch_reason(seg(), done=0, max_relaunches=2) == "rank_lost"
    assert relaunch_reason(seg(), done=1, max_relaunches=2) == "rank_lost"
    assert relaunch_reason(seg(), done=2, max_relaunches=2) is None


def test_zero_relaunches_is_the_old_behaviour():
    assert relaunch_reason(seg(), done=0, max_relaunches=0) is None


def test_an_error_is_relaunched_only_when_rank_0_saved_the_resume_state():
    assert relaunch_reason(seg(exit=70), 0, 2) == "error"
    assert relaunch_reason(seg(exit=70, saved=False, resume_state=False), 0, 2) is None


def test_an_error_before_the_segments_first_step_is_not_relaunched_because_the_same_start_would_fail_again():
    assert relaunch_reason(seg(exit=70, stepped=False), 0, 2) is None  # e.g. an engine that cannot load its model
    assert relaunch_reason(seg(exit=70, stepped=True), 0, 2) == "error"
    assert relaunch_reason(seg(exit=69, stepped=False), 0, 2) == "rank_lost"  # a killed rank is relaunched anyway


@pytest.mark.parametrize("code", [0, 1, 2, 75, 137, 143])
def test_a_preemption_a_usage_error_or_any_other_status_is_never_relaunched(code):
    assert relaunch_reason(seg(exit=code), 0, 2) is None


def test_a_preemption_signal_during_the_segment_prevents_the_relaunch_even_after_a_lost_rank():
    assert relaunch_reason(seg(preempted=True), 0, 2) is None


def test_without_a_new_state_the_earlier_one_is_resumed_only_if_the_segment_never_resumed_from_it():
    assert relaunch_reason(seg(saved=False, resumed=False), 0, 2) == "rank_lost"  # lost while it started
    assert relaunch_reason(seg(saved=False, resumed=True), 0, 2) is None  # it went on: that state is stale
    assert relaunch_reason(seg(saved=False, resume_state=False), 0, 2) is None  # nothing to resume


def test_the_exit_statuses_agree_with_the_launchers():
    from jobs.train import ERROR_EXIT, RANK_LOST_EXIT

    assert set(recovery.RELAUNCH_REASONS) == {RANK_LOST_EXIT, ERROR_EXIT}


#: the scripted segments after which rank 0 saved a resume state (a lost rank: 69; an error: 70)
SAVING = ("lost", "error at start", "error after a step")
#: the scripted segments whose rank 0 died (SIGKILL): no save at the end, maybe a periodic one (resume_saved) before
RANK_0_KILLED = ("rank 0 killed after a save", "rank 0 killed before a save")


class SegmentsDouble:
    """Stands in for mpirun + ranks: each call plays the next scripted segment (its events, files, exit)."""

    def __init__(self, run_dir, events, script):
        self.run_dir, self.events, self.script, self.calls = run_dir, events, list(script), 0
        self.steps_saved = 0  # the steps_done of the resume state on disk

    def __call__(self) -> int:
        kind = self.script[self.calls]
        self.calls += 1
        if kind == "lost at start":  # a rank killed while rank 0 imported: rank 0 killed too, no event, no state
            return 69  # what _failed makes of it (its rank_lost event is the double's on_failure's business)
        with open(self.events, "a") as f:
            f.write(json.dumps({"t": float(self.calls), "event": "resumed" if self.calls > 1 else "started",
                                "steps_done": self.steps_saved}) + "\n")
            if kind == "rank 0 killed after a save":  # a step, then rank 0's periodic state, then SIGKILL
                self.steps_saved += 1
                f.write(json.dumps({"t": self.calls + 0.5, "event": "resume_saved",
                                    "steps_done": self.steps_saved}) + "\n")
            if kind == "error after a step":
                f.write(json.dumps({"t": self.calls + 0.25, "event": "step"}) + "\n")
            if kind in SAVING:
                f.write(json.dumps({"t": self.calls + 0.5, "event": "lost_rank_saved"}) + "\n")
        if kind in RANK_0_KILLED:
            if kind == "rank 0 killed after a save":
                (self.run_dir / "resume").mkdir(exist_ok=True)
                (self.run_dir / "resume" / "state.json").write_text("{}")
            return 69  # what _failed makes of mpirun's status without a summary
        if kind in SAVING:
            (self.run_dir / "resume").mkdir(exist_ok=True)
            (self.run_dir / "resume" / "state.json").write_text("{}")
            return 69 if kind == "lost" else 70
        if kind == "preempted":
            return PREEMPTED_EXIT
        (self.run_dir / "summary.json").write_text(json.dumps({"steps": 4}))
        return 0


def run(tmp_path, script, max_relaunches=2, precheck=lambda: None, preempted=lambda: False):
    events = tmp_path / "events.jsonl"
    launch = SegmentsDouble(tmp_path, events, script)
    failures = []

    def on_failure(code, before):
        failures.append((code, before))
        return code

    code = supervise.supervise(tmp_path, events, max_relaunches, launch, on_failure, precheck, preempted)
    relaunched = [json.loads(line) for line in events.read_text().splitlines()
                  if json.loads(line)["event"] == "relaunched"]
    return code, launch.calls, failures, relaunched


def test_a_lost_rank_then_a_finished_segment_ends_with_the_summary_and_one_relaunched_event(tmp_path):
    code, calls, failures, relaunched = run(tmp_path, ["lost", "done"])
    assert (code, calls) == (0, 2)
    assert failures == [(69, 0)]
    assert [{k: e[k] for k in ("attempt", "after_exit", "reason")} for e in relaunched] == [
        {"attempt": 1, "after_exit": 69, "reason": "rank_lost"}]
    summary = supervise.add_relaunches(tmp_path / "summary.json", tmp_path / "events.jsonl")
    assert summary["relaunches"] == 1
    assert json.loads((tmp_path / "summary.json").read_text())["relaunches"] == 1


def test_the_relaunched_event_continues_the_time_line(tmp_path):
    run(tmp_path, ["lost", "done"])
    times = [json.loads(line)["t"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert times == sorted(times)


def test_the_budget_ends_the_relaunches_with_the_lost_ranks_exit(tmp_path):
    code, calls, failures, relaunched = run(tmp_path, ["lost", "lost", "lost", "done"])
    assert (code, calls) == (69, 3)
    assert [e["attempt"] for e in relaunched] == [1, 2]
    assert [before for _, before in failures] == [0, 3, 6]  # each segment's own events (2, and 1 relaunched)


def test_an_error_while_the_run_starts_ends_the_command_at_once_with_exit_70_and_no_relaunch(tmp_path):
    code, calls, failures, relaunched = run(tmp_path, ["error at start", "done"])
    assert (code, calls, failures, relaunched) == (70, 1, [(70, 0)], [])


def test_an_error_after_a_step_is_relaunched_and_a_second_one_at_the_start_ends_the_relaunches(tmp_path):
    code, calls, failures, relaunched = run(tmp_path, ["error after a step", "error at start", "done"])
    assert (code, calls) == (70, 2)
    assert [(e["attempt"], e["after_exit"], e["reason"]) for e in relaunched] == [(1, 70, "error")]


def test_a_preempted_segment_is_returned_as_is(tmp_path):
    code, calls, failures, relaunched = run(tmp_path, ["preempted", "done"])
    assert (code, calls, failures, relaunched) == (PREEMPTED_EXIT, 1, [], [])


def test_a_failing_resume_precheck_ends_the_command_without_a_relaunch(tmp_path, capsys):
    def precheck():
        raise ConfigError("resume/state.json: broken")

    code, calls, _, relaunched = run(tmp_path, ["lost", "done"], precheck=precheck)
    assert (code, calls, relaunched) == (69, 1, [])
    assert "not relaunched: resume/state.json: broken" in capsys.readouterr().err


def test_a_preemption_that_comes_during_the_precheck_ends_as_preempted(tmp_path):
    signals = []
    code, calls, _, relaunched = run(tmp_path, ["lost", "done"], precheck=lambda: signals.append("SIGTERM"),
                                     preempted=lambda: bool(signals))
    assert (code, calls, relaunched) == (PREEMPTED_EXIT, 1, [])


def test_the_relaunch_budget_may_change_across_a_resume():
    from gyre_hpc.lifecycle import resume
    from gyre_hpc.config import load_config, to_dict

    saved = to_dict(load_config("configs/local.yaml", []))
    assert resume.config_changes(saved, to_dict(load_config("configs/local.yaml", ["run.max_relaunches=0"]))) == {}
    del saved["run"]["max_relaunches"]  # a run directory written before the key existed
    assert resume.config_changes(saved, to_dict(load_config("configs/local.yaml", []))) == {}


def test_a_segment_whose_rank_0_died_after_a_periodic_save_is_relaunched_even_after_a_resume():
    assert relaunch_reason(seg(saved=False, resumed=True, checkpointed=True), 0, 2) == "rank_lost"
    assert relaunch_reason(seg(exit=70, saved=False, resumed=True, checkpointed=True), 0, 2) == "error"
    assert relaunch_reason(seg(saved=False, resumed=True, checkpointed=True), 2, 2) is None  # the budget
    assert relaunch_reason(seg(saved=False, resumed=True, checkpointed=True, preempted=True), 0, 2) is None
    assert relaunch_reason(seg(exit=2, saved=False, resumed=True, checkpointed=True), 0, 2) is None
    assert relaunch_reason(seg(saved=False, resumed=True, checkpointed=True, resume_state=False), 0, 2) is None


def test_only_a_periodic_save_newer_than_the_state_the_segment_resumed_from_counts():
    saved = {"event": "resume_saved", "steps_done": 3}
    assert recovery.saved_newer([{"event": "start"}, {"event": "resume_saved", "steps_done": 1}])
    assert recovery.saved_newer([{"event": "resumed", "steps_done": 2}, saved])
    assert not recovery.saved_newer([{"event": "resumed", "steps_done": 3}, saved])
    assert not recovery.saved_newer([{"event": "resumed", "steps_done": 2}, {"event": "lost_rank_saved"}])


def test_rank_0_killed_after_each_periodic_save_is_relaunched_until_the_run_finishes(tmp_path):
    code, calls, failures, relaunched = run(tmp_path, ["rank 0 killed after a save"] * 2 + ["done"])
    assert (code, calls) == (0, 3)
    assert [(e["attempt"], e["after_exit"], e["reason"]) for e in relaunched] == [(1, 69, "rank_lost"),
                                                                                   (2, 69, "rank_lost")]


def test_rank_0_killed_again_before_a_newer_save_ends_the_relaunches_so_no_loop_can_form(tmp_path):
    code, calls, _, relaunched = run(tmp_path, ["rank 0 killed after a save", "rank 0 killed before a save",
                                                "done"], max_relaunches=5)
    assert (code, calls) == (69, 2)
    assert [e["attempt"] for e in relaunched] == [1]


def test_rank_0_killed_before_any_save_ends_the_command(tmp_path):
    code, calls, _, relaunched = run(tmp_path, ["rank 0 killed before a save", "done"])
    assert (code, calls, relaunched) == (69, 1, [])


def test_the_periodic_save_interval_may_change_across_a_resume():
    from gyre_hpc.lifecycle import resume
    from gyre_hpc.config import load_config, to_dict

    saved = to_dict(load_config("configs/local.yaml", []))
    now = to_dict(load_config("configs/local.yaml", ["run.resume_every_steps=5"]))
    assert resume.config_changes(saved, now) == {}


# --- a rank lost while the segment started (before rank 0's main loop): nothing applied, nothing saved

def test_a_new_run_torn_down_while_it_started_is_relaunched_with_no_state_to_resume():
    fresh = seg(saved=False, resume_state=False, stepped=False, started=False)
    assert relaunch_reason(fresh, 0, 2) == recovery.AT_START == "rank_lost_at_start"
    assert relaunch_reason(fresh, 1, 2) == "rank_lost_at_start"


def test_a_resumed_run_torn_down_before_it_resumed_is_relaunched_from_the_state_it_started_from():
    assert relaunch_reason(seg(saved=False, resume_state=True, stepped=False, started=False), 0, 2) == \
        "rank_lost_at_start"


def test_a_start_up_loss_is_bounded_by_the_budget_and_never_outranks_a_preemption_or_an_error():
    fresh = dict(saved=False, resume_state=False, stepped=False, started=False)
    assert relaunch_reason(seg(**fresh), 2, 2) is None
    assert relaunch_reason(seg(**fresh), 0, 0) is None
    assert relaunch_reason(seg(**fresh, preempted=True), 0, 2) is None
    assert relaunch_reason(seg(**{**fresh, "exit": 70}), 0, 2) is None  # a rank raised while starting: same again
    assert relaunch_reason(seg(**{**fresh, "exit": 75}), 0, 2) is None


def test_a_segment_whose_rank_0_reached_its_main_loop_is_not_a_start_up_loss():
    assert relaunch_reason(seg(saved=False, resume_state=False, started=True), 0, 2) is None  # it may have trained
    assert not seg(saved=True, started=False).at_start  # lost_rank_saved is written from the main loop


@pytest.mark.parametrize("kinds, started", [
    ((), False), (("rank_lost",), False), (("relaunched", "rank_lost"), False),
    (("start",), True), (("resumed",), True), (("start", "started"), True),
])
def test_a_segment_started_once_its_rank_0_logged_start_or_resumed(tmp_path, kinds, started):
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"t": 0.0, "event": k}) + "\n" for k in kinds))
    assert supervise.segment(tmp_path, events, 69, 0, False).started is started


def test_a_new_run_lost_while_it_started_is_relaunched_without_a_resume_precheck_and_finishes(tmp_path):
    def precheck():
        raise ConfigError("--resume: no resume state there")  # what gyre train's pre-check says of a new run

    code, calls, failures, relaunched = run(tmp_path, ["lost at start", "done"], precheck=precheck)
    assert (code, calls, failures) == (0, 2, [(69, 0)])
    assert [(e["attempt"], e["after_exit"], e["reason"]) for e in relaunched] == [(1, 69, "rank_lost_at_start")]
    assert not (tmp_path / "resume").exists()


def test_a_start_that_is_lost_every_time_ends_after_the_budget_with_the_lost_ranks_exit(tmp_path):
    code, calls, failures, relaunched = run(tmp_path, ["lost at start"] * 4, max_relaunches=2)
    assert (code, calls) == (69, 3)
    assert [e["attempt"] for e in relaunched] == [1, 2]
    assert [c for c, _ in failures] == [69, 69, 69]
