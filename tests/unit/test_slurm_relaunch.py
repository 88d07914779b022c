"""gyre_hpc.slurm.relaunch and the sbatch script's step loop: a step that lost a rank is srun again inside the same
allocation; a preemption or a cancel never is. The script runs under bash with srun and scontrol replaced at their
boundary (doubles that play what the ranks do); the helper is the real module."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gyre_hpc.slurm import relaunch
from test_sbatch import FAKE_SRUN, run_rendered_script  # the same srun/scontrol doubles as the requeue tests



def step(run_dir: Path, *events: str, signal_name: str = "SIGTERM", earlier: tuple[str, ...] = ()) -> None:
    """What a step's rank 0 leaves: RUN_DIR/.step-start (the script), a resume state, and its events (``earlier``:
    events an earlier step logged before this one started)."""
    (run_dir / "resume").mkdir(parents=True, exist_ok=True)
    (run_dir / "resume" / "state.json").write_text("{}")
    with open(run_dir / "events.jsonl", "a") as f:
        for kind in earlier:
            f.write(json.dumps({"t": 0.5, "wall": time.time() - 200, "event": kind}) + "\n")
        for kind in events:
            rec = {"t": 1.0, "wall": time.time(), "event": kind}
            rec.update({"signal": signal_name} if kind == "preempted" else {})
            f.write(json.dumps(rec) + "\n")
    (run_dir / ".step-start").touch()
    past = time.time() - 100
    os.utime(run_dir / ".step-start", (past, past))


def ask(run_dir: Path, code: int, done: int = 0, most: int = 2, *extra: str) -> int:
    return relaunch.main(["--run-dir", str(run_dir), "--exit", str(code), "--done", str(done), "--max", str(most),
                          *extra])


def relaunched(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [e for e in events if e["event"] == "relaunched"]


@pytest.mark.parametrize("code", [69, 137, 143])
def test_a_step_whose_rank_0_saved_after_a_lost_rank_is_relaunched_and_recorded(tmp_path, code):
    step(tmp_path, "start", "lost_rank_saved", "stop")  # srun's --kill-on-bad-exit: SIGTERM, no request: a loss
    assert ask(tmp_path, code) == 0
    (e,) = relaunched(tmp_path)
    assert (e["attempt"], e["after_exit"], e["reason"]) == (1, code, "rank_lost")


@pytest.mark.parametrize("signal_name", ["SIGUSR1", "SIGTERM"])
def test_a_preempted_step_is_never_relaunched_whatever_the_signal(tmp_path, signal_name):
    """SIGUSR1: scancel --signal=USR1 to the steps. SIGTERM: ranks srun started without the batch script (by hand,
    or a script rendered before it exported GYRE_SBATCH_LAUNCHED) take srun's teardown for a preemption."""
    step(tmp_path, "start", "preempted", signal_name=signal_name)
    assert ask(tmp_path, 75) == 1 and ask(tmp_path, 143) == 1 and relaunched(tmp_path) == []


def test_a_step_without_lost_rank_saved_or_a_success_is_not_relaunched(tmp_path):
    step(tmp_path, "start")  # a resume state on disk, but not this step's lost-rank save
    assert ask(tmp_path, 137) == 1
    step(tmp_path / "ok", "start", "lost_rank_saved")
    assert ask(tmp_path / "ok", 0) == 1
    assert relaunched(tmp_path) == [] and relaunched(tmp_path / "ok") == []


def test_an_earlier_steps_lost_rank_saved_does_not_count_for_this_step(tmp_path):
    step(tmp_path, "start", earlier=("lost_rank_saved",))
    assert ask(tmp_path, 137) == 1 and relaunched(tmp_path) == []


def periodic(run_dir: Path, resumed_at: int | None, saved_at: int | None) -> None:
    """Events of a step whose rank 0 died: it resumed at ``resumed_at`` steps (None: a new run) and saved its
    periodic state at ``saved_at`` (None: never), after RUN_DIR/.step-start."""
    step(run_dir, "start")
    with open(run_dir / "events.jsonl", "a") as f:
        for kind, n in (("resumed", resumed_at), ("resume_saved", saved_at)):
            if n is not None:
                f.write(json.dumps({"t": 2.0, "wall": time.time(), "event": kind, "steps_done": n}) + "\n")


@pytest.mark.parametrize("code", [137, 143, 69])
def test_a_step_whose_rank_0_died_after_a_newer_periodic_save_is_relaunched(tmp_path, code):
    periodic(tmp_path, resumed_at=2, saved_at=3)  # rank 0 SIGKILLed: no lost_rank_saved, srun ends the step
    assert ask(tmp_path, code) == 0
    (e,) = relaunched(tmp_path)
    assert (e["attempt"], e["after_exit"], e["reason"]) == (1, code, "rank_lost")


def test_a_step_whose_rank_0_died_before_a_newer_periodic_save_is_not_relaunched(tmp_path):
    periodic(tmp_path, resumed_at=3, saved_at=None)
    assert ask(tmp_path, 137) == 1
    periodic(tmp_path / "same", resumed_at=3, saved_at=3)  # a state no newer than the one it resumed from
    assert ask(tmp_path / "same", 137) == 1
    assert relaunched(tmp_path) == [] and relaunched(tmp_path / "same") == []


def test_a_periodic_save_does_not_turn_a_preemption_or_a_success_into_a_relaunch(tmp_path):
    periodic(tmp_path, resumed_at=None, saved_at=1)
    step(tmp_path, "preempted", signal_name="SIGUSR1")
    assert ask(tmp_path, 75) == 1 and ask(tmp_path, 143) == 1
    periodic(tmp_path / "ok", resumed_at=None, saved_at=1)
    assert ask(tmp_path / "ok", 0) == 1
    (tmp_path / "ok" / "summary.json").write_text("{}")  # finished, then failed its own check (data loss: exit 2)
    assert ask(tmp_path / "ok", 2) == 1
    assert relaunched(tmp_path) == [] and relaunched(tmp_path / "ok") == []


def test_the_budget_ends_the_relaunches(tmp_path):
    step(tmp_path, "lost_rank_saved")
    assert ask(tmp_path, 69, 2, 2) == 1
    assert ask(tmp_path, 69, 0, 0) == 1


def test_a_script_rendered_before_still_passes_its_preempt_signal_and_is_answered(tmp_path):
    """A requeued job runs the script it was submitted with, which may pass --preempt-signal (now ignored)."""
    step(tmp_path, "lost_rank_saved")
    assert ask(tmp_path, 137, 0, 2, "--preempt-signal", "SIGUSR1") == 0 and len(relaunched(tmp_path)) == 1


#: srun double: the first step plays a lost rank (rank 0 saves and logs lost_rank_saved, srun ends the step with the
#: SIGKILLed rank's 137), the next finishes
LOSING_SRUN = """#!/bin/bash
n=$(cat "$GYRE_RUN_DIR/steps" 2>/dev/null || echo 0); echo $((n + 1)) > "$GYRE_RUN_DIR/steps"
if (( n == 0 )); then
  mkdir -p "$GYRE_RUN_DIR/resume"; sleep 0.05; echo "{}" > "$GYRE_RUN_DIR/resume/state.json"
  event='{"t": 1.0, "wall": '"$(date +%s.%N)"', "event": "lost_rank_saved"}'
  echo "$event" >> "$GYRE_RUN_DIR/events.jsonl"
  exit 137
fi
rm -rf "$GYRE_RUN_DIR/resume"; exit 0
"""
#: srun double that waits for a signal, then saves and exits 75 (as preempted ranks do); the scontrol double
WAITING_SRUN = FAKE_SRUN


def job(tmp_path: Path, srun: str, overrides=()) -> tuple[subprocess.Popen, Path]:
    return run_rendered_script(tmp_path, srun, overrides)


def test_the_script_sruns_a_step_that_lost_a_rank_again_in_the_same_allocation(tmp_path):
    proc, run_dir = job(tmp_path, LOSING_SRUN)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (run_dir / "steps").read_text().strip() == "2"
    assert not (run_dir / "scontrol.log").exists()  # never requeued: relaunched inside the allocation
    assert "relaunching in this allocation (1 of at most 2" in err
    assert [e["after_exit"] for e in relaunched(run_dir)] == [137]


def test_with_no_relaunches_the_lost_step_is_requeued_as_before(tmp_path):
    proc, run_dir = job(tmp_path, LOSING_SRUN, ["run.max_relaunches=0"])
    _, err = proc.communicate(timeout=60)
    assert (run_dir / "steps").read_text().strip() == "1"
    assert "requeue 7" in (run_dir / "scontrol.log").read_text() and proc.returncode == 0, err
    assert relaunched(run_dir) == []


@pytest.mark.parametrize("signal_name", ["USR1", "TERM"])
def test_a_signal_to_the_batch_shell_is_never_relaunched(tmp_path, signal_name):
    proc, run_dir = job(tmp_path, WAITING_SRUN)
    deadline = time.time() + 30
    while not (run_dir / "step-running").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(getattr(signal, f"SIG{signal_name}"))
    _, err = proc.communicate(timeout=60)
    assert relaunched(run_dir) == [] and "relaunching" not in err
    log = run_dir / "scontrol.log"
    assert (log.is_file() and "requeue 7" in log.read_text()) == (signal_name == "USR1"), err


# --- a step torn down while rank 0 started (a cell's rank killed before rank 0's main loop): srun's SIGKILL comes
#     KillWait after its SIGTERM, while rank 0 still imports or sits in MPI_Init: no event, nothing saved

def started_step(run_dir: Path, resume_state: str | None = None) -> None:
    """RUN_DIR as such a step leaves it: the resume state it started from (``resume_state``; None: a new run), an
    earlier step's events, RUN_DIR/.step-start, and nothing of its own."""
    if resume_state is not None:
        (run_dir / "resume").mkdir(parents=True)
        (run_dir / "resume" / "state.json").write_text(resume_state)
    with open(run_dir / "events.jsonl", "a") as f:
        f.write(json.dumps({"t": 0.5, "wall": time.time() - 200, "event": "start"}) + "\n")
    (run_dir / ".step-start").touch()
    past = time.time() - 100
    os.utime(run_dir / ".step-start", (past, past))


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("code", [137, 143])
def test_a_new_run_torn_down_while_rank_0_started_is_relaunched_with_nothing_saved(tmp_path, code):
    started_step(tmp_path)
    assert ask(tmp_path, code) == 0
    (e,) = relaunched(tmp_path)
    assert (e["attempt"], e["after_exit"], e["reason"]) == (1, code, "rank_lost_at_start")
    assert not (tmp_path / "resume").exists()


def test_a_resumed_run_torn_down_while_rank_0_started_is_relaunched_from_its_untouched_state(tmp_path):
    started_step(tmp_path, resume_state='{"steps": 3}')
    assert ask(tmp_path, 137) == 0
    assert relaunched(tmp_path)[0]["reason"] == "rank_lost_at_start"
    assert (tmp_path / "resume" / "state.json").read_text() == '{"steps": 3}'


@pytest.mark.parametrize("code", [1, 2, 70])
def test_a_step_whose_ranks_exited_on_their_own_while_starting_is_not_relaunched(tmp_path, code):
    """A status below 128: no rank was killed (a config error on every rank, a broken install, srun itself)."""
    started_step(tmp_path)
    assert ask(tmp_path, code) == 1 and relaunched(tmp_path) == []


def test_a_rank_that_raised_while_the_step_started_is_an_error_never_relaunched(tmp_path):
    started_step(tmp_path)
    (tmp_path / "errors").mkdir()
    (tmp_path / "errors" / "rank2.txt").write_text("EngineError: cannot load the model\n")
    assert ask(tmp_path, 137) == 1 and relaunched(tmp_path) == []


def test_an_earlier_steps_error_file_does_not_stop_a_start_up_relaunch(tmp_path):
    (tmp_path / "errors").mkdir()
    (tmp_path / "errors" / "rank2.txt").write_text("EngineError: an earlier step\n")
    started_step(tmp_path)
    old = time.time() - 300
    os.utime(tmp_path / "errors" / "rank2.txt", (old, old))
    assert ask(tmp_path, 137) == 0


def test_a_preemption_while_rank_0_started_is_not_a_start_up_loss(tmp_path):
    started_step(tmp_path)
    step(tmp_path, "preempted", signal_name="SIGUSR1")  # rank 0 saved the empty state and logged it
    assert ask(tmp_path, 143) == 1 and relaunched(tmp_path) == []


@pytest.mark.parametrize("done, most", [(2, 2), (0, 0)])
def test_a_start_up_loss_after_the_budget_is_a_failure_with_its_own_exit_and_event(tmp_path, done, most):
    started_step(tmp_path, resume_state="{}")
    assert ask(tmp_path, 137, done, most) == relaunch.AT_START_FAILED == 69
    assert relaunched(tmp_path) == []
    last = events(tmp_path)[-1]
    assert (last["event"], last["at_start"], last["srun_exit"], last["relaunches"]) == ("rank_lost", True, 137, done)
    assert last["resume"] == str(tmp_path / "resume") and "preempted" not in [e["event"] for e in events(tmp_path)]
    assert last["t"] >= 0.5  # the run's time line goes on


#: srun double: a step torn down while rank 0 started (a rank SIGKILLed, rank 0 SIGKILLed at KillWait: no event, no
#: state; srun 137); the ``LOSSES`` first steps do that, the next one finishes
STARTUP_SRUN = """#!/bin/bash
n=$(cat "$GYRE_RUN_DIR/steps" 2>/dev/null || echo 0); echo $((n + 1)) > "$GYRE_RUN_DIR/steps"
if (( n < LOSSES )); then exit 137; fi
echo '{"steps": 2}' > "$GYRE_RUN_DIR/summary.json"; exit 0
"""


def startup_job(tmp_path: Path, losses: int, overrides=()) -> tuple[subprocess.Popen, Path]:
    return run_rendered_script(tmp_path, STARTUP_SRUN.replace("LOSSES", str(losses)), overrides)


def test_the_script_sruns_a_step_torn_down_while_rank_0_started_again_and_the_job_completes(tmp_path):
    proc, run_dir = startup_job(tmp_path, 1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (run_dir / "steps").read_text().strip() == "2"
    assert not (run_dir / "scontrol.log").exists()  # relaunched inside the allocation, never requeued
    assert [(e["after_exit"], e["reason"]) for e in relaunched(run_dir)] == [(137, "rank_lost_at_start")]


def test_a_start_that_is_lost_every_time_fails_the_job_with_69_after_the_budget_never_requeued(tmp_path):
    proc, run_dir = startup_job(tmp_path, 99)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 69, err
    assert (run_dir / "steps").read_text().strip() == "3"  # the first step and 2 relaunches (run.max_relaunches)
    assert not (run_dir / "scontrol.log").exists()
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds == ["relaunched", "relaunched", "rank_lost"] and "the job fails with 69" in err


def test_with_no_relaunches_a_start_up_loss_fails_the_job_with_69_at_once(tmp_path):
    proc, run_dir = startup_job(tmp_path, 99, ["run.max_relaunches=0"])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 69 and (run_dir / "steps").read_text().strip() == "1", err
    assert [e["event"] for e in events(run_dir)] == ["rank_lost"]
