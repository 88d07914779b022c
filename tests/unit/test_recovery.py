"""gyre_hpc.lifecycle.recovery: one exit status per outcome, stop reasons that survive the trip through text, and
one rule that decides relaunch, requeue or fail (the relaunch cases in detail: test_supervise.py,
test_slurm_relaunch.py; the requeue counts: test_rank_signals.py, test_submitit_cancel.py)."""
import pytest

from gyre_hpc.lifecycle import recovery
from gyre_hpc.lifecycle.recovery import (EXIT, Action, JobOutcome, OutcomeKind, LaunchSegment, StopKind, StopReason, decide,
                                         outcome_of, step_segment)


def test_every_outcome_has_its_own_exit_status_and_the_table_inverts():
    assert set(EXIT) == set(OutcomeKind)
    assert len(set(EXIT.values())) == len(EXIT)
    assert all(outcome_of(code) is kind for kind, code in EXIT.items())
    assert outcome_of(137) is None  # a signal's status is no outcome
    assert (recovery.PREEMPTED_EXIT, recovery.RANK_LOST_EXIT, recovery.ERROR_EXIT) == (75, 69, 70)


def test_an_outcome_reports_the_status_of_its_kind():
    assert JobOutcome(OutcomeKind.PREEMPTED).exit == recovery.PREEMPTED_EXIT
    assert JobOutcome(OutcomeKind.FINISHED, summary={"error": "data loss: 3 of 4"}).failed
    assert not JobOutcome(OutcomeKind.FINISHED, summary={"steps": 4}).failed


@pytest.mark.parametrize("reason", [
    StopReason(StopKind.PREEMPTED, "SIGUSR1"),
    StopReason(StopKind.RANK_LOST, "SIGTERM from mpirun (a rank of the job ended)"),
    StopReason(StopKind.DATA_LOSS, "data loss: 2 of 8 groups lost"),
    StopReason(StopKind.ERROR, "RuntimeError: boom"),
    StopReason(StopKind.DONE, "4 optimizer steps done"),
    StopReason(StopKind.DONE, "core cell 0 lost"),
    StopReason(StopKind.DONE, "interrupted"),
])
def test_a_stop_reason_is_read_back_from_its_text(reason):
    assert StopReason.parse(str(reason)) == reason


def test_the_text_of_a_stop_reason_is_what_cells_and_events_have_always_read():
    assert str(StopReason(StopKind.PREEMPTED, "SIGTERM")) == "preempted: SIGTERM"
    assert str(StopReason(StopKind.DATA_LOSS, "data loss: x")) == "error: data loss: x"
    assert StopReason.parse("preempted").kind is StopKind.PREEMPTED  # a Shutdown without a signal's name
    assert StopReason(StopKind.RANK_LOST, "x").saves_resume and not StopReason(StopKind.ERROR, "x").saves_resume


def seg(**kw) -> LaunchSegment:
    base = dict(exit=69, saved=True, resume_state=True, resumed=False, preempted=False)
    return LaunchSegment(**{**base, **kw})


def test_the_launcher_relaunches_a_lost_rank_requeues_a_preemption_and_lets_anything_else_fail():
    assert decide(seg(), 0, 2) == recovery.RecoveryDecision(Action.RELAUNCH, 69, "rank_lost")
    assert decide(seg(exit=75), 0, 2).action is Action.REQUEUE
    assert decide(seg(), 2, 2) == recovery.RecoveryDecision(Action.FAIL, 69)
    assert decide(seg(exit=0), 0, 2).action is Action.FAIL


def test_a_rank_lost_while_starting_with_no_relaunch_left_fails_as_a_start_up_loss():
    fresh = dict(saved=False, resume_state=False, started=False, stepped=False)
    assert decide(seg(**fresh), 0, 2).reason == recovery.AT_START
    assert decide(seg(**fresh), 2, 2).lost_at_start
    assert not decide(seg(**fresh, preempted=True), 0, 2).lost_at_start


def test_a_step_under_srun_is_a_lost_rank_only_without_preemption_summary_or_error_file():
    saved = [{"event": "start"}, {"event": "lost_rank_saved"}]
    assert step_segment(137, saved, errors=False, finished=False, resume_state=True).exit == 69
    assert step_segment(137, saved + [{"event": "preempted"}], False, False, True).exit == 137
    assert step_segment(137, saved, errors=False, finished=True, resume_state=True).exit == 137
    assert step_segment(137, [], errors=False, finished=False, resume_state=False).at_start  # torn down at start
    assert step_segment(137, [], errors=True, finished=False, resume_state=False).exit == 137  # a rank raised
    assert step_segment(0, saved, errors=False, finished=False, resume_state=True).exit == 0
