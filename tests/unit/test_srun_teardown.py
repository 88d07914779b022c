"""gyre_hpc.live.lost.SrunTeardown: rank 0 under the sbatch script takes a SIGTERM for srun's teardown after a lost
rank, unless the batch script's RUN_DIR/preempt.request (or another preemption) comes within the grace. The clock
is a ManualClock; the request file and the Preemption are the real ones."""
import re
import signal
from pathlib import Path

import pytest

from gyre_hpc.clock import ManualClock
from gyre_hpc.lifecycle.recovery import REQUEST_FILE, SBATCH_ENV, StopKind
from gyre_hpc.live import lost
from gyre_hpc.live.launch import LAUNCHED_ENV
from gyre_hpc.live.preempt import Preemption

ROOT = Path(__file__).resolve().parents[2]


def teardown_at(tmp_path, clock):
    preemption = Preemption(clock=clock).watch(tmp_path / REQUEST_FILE)
    return lost.SrunTeardown(preemption, tmp_path / REQUEST_FILE, clock=clock), preemption


def sigterm(teardown):
    teardown._handler(signal.SIGTERM, None)  # what the installed handler runs


def test_the_harness_closes_at_the_sigterm_before_it_is_decided(tmp_path):
    clock = ManualClock()
    closed = []
    teardown, preemption = teardown_at(tmp_path, clock)
    preemption.on_signal = lambda: closed.append(clock.now())  # run_root sets it to Rollouts.close
    sigterm(teardown)
    sigterm(teardown)
    assert closed == [0.0] and not teardown.requested and not preemption.requested


def test_a_sigterm_with_no_request_is_srun_teardown_once_the_grace_has_passed(tmp_path):
    clock = ManualClock()
    teardown, preemption = teardown_at(tmp_path, clock)
    assert not teardown.requested
    sigterm(teardown)
    clock.advance(lost.REQUEST_GRACE_S / 2)
    assert not teardown.requested  # the batch script may still be writing its request
    clock.advance(lost.REQUEST_GRACE_S / 2)
    assert teardown.requested and not preemption.poll(force=True).requested
    assert str(teardown.reason()) == "rank_lost: SIGTERM from srun (a rank of the step ended)"
    assert teardown.reason().kind is StopKind.RANK_LOST  # the root's lost-rank path (no orderly shutdown, exit 69)


def test_a_request_within_the_grace_makes_the_sigterm_a_preemption_for_good(tmp_path):
    clock = ManualClock()
    teardown, preemption = teardown_at(tmp_path, clock)
    sigterm(teardown)
    clock.advance(lost.REQUEST_GRACE_S / 2)
    (tmp_path / REQUEST_FILE).write_text("SIGTERM\n")  # the batch shell's TERM trap (scancel JOBID)
    assert not teardown.requested
    assert preemption.poll(force=True).signal == "SIGTERM"
    (tmp_path / REQUEST_FILE).unlink()  # served: rank 0 removes it when the resume state is saved
    clock.advance(10 * lost.REQUEST_GRACE_S)
    assert not teardown.requested  # decided once: the orderly preempted shutdown is never abandoned


def test_a_preemption_requested_before_the_sigterm_keeps_it_from_being_a_teardown(tmp_path):
    clock = ManualClock()
    teardown, preemption = teardown_at(tmp_path, clock)
    preemption.request("SIGUSR1")  # scancel --signal=USR1 to the steps: no request file
    sigterm(teardown)  # srun ends the other ranks once one exited 75
    clock.advance(10 * lost.REQUEST_GRACE_S)
    assert not teardown.requested and preemption.signal == "SIGUSR1"


def test_a_decided_teardown_stays_one_when_a_request_comes_late(tmp_path):
    clock = ManualClock()
    teardown, _ = teardown_at(tmp_path, clock)
    sigterm(teardown)
    clock.advance(lost.REQUEST_GRACE_S)
    assert teardown.requested
    (tmp_path / REQUEST_FILE).write_text("SIGTERM\n")
    assert teardown.requested  # rank 0 is already saving the lost-rank state: it does not switch paths


def test_a_sigterm_noted_while_rank_0_started_is_decided_by_the_same_rule_from_when_it_came(tmp_path):
    early_clock, clock = ManualClock(100.0), ManualClock(7.0)  # two clocks, two origins (WallClock: its creation)
    early = Preemption(clock=early_clock)
    early.request("SIGTERM")  # early_preemption's handler, before MPI_Init
    early_clock.advance(lost.REQUEST_GRACE_S / 2)
    teardown = lost.SrunTeardown(early, tmp_path / REQUEST_FILE, clock=clock).adopt()
    assert not early.requested and teardown.signal == "SIGTERM"
    assert teardown.since_s() == pytest.approx(lost.REQUEST_GRACE_S / 2)
    assert not teardown.requested
    clock.advance(lost.REQUEST_GRACE_S / 2)  # the grace counts from the signal, not from the adoption
    assert teardown.requested


def test_a_start_up_sigterm_the_request_file_explains_stays_a_preemption(tmp_path):
    clock = ManualClock()
    (tmp_path / REQUEST_FILE).write_text("SIGTERM\n")
    early = Preemption(clock=clock)
    early.request("SIGTERM")
    teardown = lost.SrunTeardown(early, tmp_path / REQUEST_FILE, clock=clock).adopt()
    clock.advance(10 * lost.REQUEST_GRACE_S)
    assert early.signal == "SIGTERM" and not teardown.requested


def test_the_installed_handler_notes_sigterm_and_leaves_sigusr1_to_the_preemption(tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        preemption = Preemption().install()
        teardown = lost.SrunTeardown(preemption, tmp_path / REQUEST_FILE).install()
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGTERM)
        assert preemption.signal == "SIGUSR1" and teardown.signal == "SIGTERM"
        assert not teardown.requested  # a preemption came first
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_the_grace_is_well_under_the_local_clusters_killwait():
    """rank 0 must decide and save (milliseconds) before srun's SIGKILL, KillWait after its SIGTERM."""
    kill_wait = int(re.search(r"^KillWait=(\d+)$", (ROOT / "scripts/local-slurm.sh").read_text(), re.M).group(1))
    assert 0 < lost.REQUEST_GRACE_S <= kill_wait / 3


@pytest.mark.parametrize("env,kind", [({LAUNCHED_ENV: "1"}, lost.Teardown), ({SBATCH_ENV: "1"}, lost.SrunTeardown),
                                      ({}, type(None))])
def test_rank_0_takes_sigterm_for_a_teardown_only_where_a_launcher_writes_the_request(tmp_path, monkeypatch, env,
                                                                                      kind):
    """gyre train (mpirun) and the sbatch script write RUN_DIR/preempt.request; srun by hand and submitit do not:
    there a SIGTERM stays a preemption (SLURM's own preemption of a submitit job must requeue it)."""
    from gyre_hpc.live import rank

    for name in (LAUNCHED_ENV, SBATCH_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = signal.getsignal(signal.SIGTERM)
    try:
        got = rank._teardown(tmp_path, Preemption())
        assert type(got) is kind
    finally:
        signal.signal(signal.SIGTERM, before)
