"""On submitit's path, a time-limit signal that comes before a task reached ``train_rank`` meets submitit's own
handler (``SignalHandler.checkpoint_and_try_requeue``), not gyre's: the job is requeued without a new resume state.
What its next segment starts from: the same ``TrainRank`` on the same RUN_DIR (``TrainRank.checkpoint``), where
the resume state an earlier segment saved is still on disk, untouched; a rank started on a RUN_DIR with a resume
state resumes from it (``live.rank._check_resume_files``, ``live.root._load_resume``), so a run with progress
goes on from its newest state, and only a run that never saved one starts again.

submitit's real handler and ``DelayedSubmission`` run here; ``scontrol requeue`` (``_requeue``) and the process
exit are replaced at that boundary (``RequeueDouble``)."""
import json
import signal

import pytest
from submitit.core import utils
from submitit.core.job_environment import SignalHandler
from submitit.core.utils import JobPaths
from submitit.slurm.slurm import SlurmJobEnvironment

from gyre_hpc.lifecycle import resume
from gyre_hpc.config import GyreConfig
from gyre_hpc.live import lost
from gyre_hpc.live.rank import _last_event_t
from gyre_hpc.slurm.submit_requeue import TrainRank
from test_lost_rank_state import state_at, write_latest


class RequeueDouble:
    """Stands in for ``scontrol requeue JOBID`` and for the task's exit after it."""

    def __init__(self):
        self.countdowns: list[int] = []

    def requeue(self, countdown: int) -> None:
        self.countdowns.append(countdown)

    def exit(self) -> None:
        raise SystemExit(-1)


def earlier_segment(run_dir) -> bytes:
    """RUN_DIR after a segment that trained 3 steps and saved its resume state (a preemption's, a lost rank's, or
    rank 0's periodic one), then its events; returns the state file's bytes."""
    write_latest(run_dir, 3)
    lost.save(run_dir, state_at(3, [0.5, 0.25, 0.0]))
    (run_dir / "events.jsonl").write_text(json.dumps({"t": 42.0, "event": "resume_saved", "steps_done": 3}) + "\n")
    return (run_dir / "resume" / "state.json").read_bytes()


@pytest.fixture
def job(tmp_path, monkeypatch):
    """Task 0 of submitit job 7, its submitted pickle a ``TrainRank`` on RUN_DIR, submitit's handler armed."""
    folder, run_dir = tmp_path / "submitit", tmp_path / "run"
    folder.mkdir()
    run_dir.mkdir()
    for key, value in {"SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_FOLDER": str(folder), "SLURM_JOB_ID": "7",
                       "SLURM_PROCID": "0", "SLURM_NTASKS": "5"}.items():
        monkeypatch.setenv(key, value)
    env = SlurmJobEnvironment()
    paths = JobPaths(folder, job_id="7", task_id=0)
    paths.folder.mkdir(parents=True, exist_ok=True)
    delayed = utils.DelayedSubmission(TrainRank(), "c.yaml", str(run_dir))
    delayed.set_timeout(10, 3)
    delayed.dump(paths.submitted_pickle)
    double = RequeueDouble()
    monkeypatch.setattr(env, "_requeue", double.requeue)
    handler = SignalHandler(env, paths, delayed)
    monkeypatch.setattr(handler, "_exit", double.exit)
    return handler, paths, run_dir, double


def test_submitits_own_handler_requeues_the_same_train_rank_on_the_same_run_dir(job):
    handler, paths, run_dir, double = job
    with pytest.raises(SystemExit):
        handler.checkpoint_and_try_requeue(signal.SIGUSR2)
    assert len(double.countdowns) == 1  # requeued
    again = utils.DelayedSubmission.load(paths.submitted_pickle)
    assert isinstance(again.function, TrainRank) and again.args == ("c.yaml", str(run_dir))


def test_the_requeued_segment_finds_the_earlier_segments_state_untouched_and_resumes_at_its_step(job):
    handler, paths, run_dir, _ = job
    before = earlier_segment(run_dir)
    with pytest.raises(SystemExit):
        handler.checkpoint_and_try_requeue(signal.SIGUSR2)
    _, next_run_dir = utils.DelayedSubmission.load(paths.submitted_pickle).args
    assert (run_dir / "resume" / "state.json").read_bytes() == before
    assert resume.exists(next_run_dir)  # what every rank of the next segment tests: it resumes, never starts over
    state = resume.load(next_run_dir)
    assert (state["version"], state["sched"]["steps_done"]) == (3, 3)
    assert _last_event_t(GyreConfig(), run_dir) > 42.0  # its time line goes on after the earlier segment's


def test_a_run_that_never_saved_a_state_is_the_only_one_that_starts_again(job):
    handler, paths, run_dir, _ = job
    with pytest.raises(SystemExit):
        handler.checkpoint_and_try_requeue(signal.SIGUSR2)
    assert not resume.exists(utils.DelayedSubmission.load(paths.submitted_pickle).args[1])
