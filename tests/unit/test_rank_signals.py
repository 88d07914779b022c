"""gyre_hpc.lifecycle.rank_signals: which signal means what to a rank, on which path, decided once from the environment.

The behaviour tests run a real rank's signal set-up (``early_preemption`` and the stack-dump registration of
gyre_hpc.live.rank) in a child process whose environment is the path's, and signal it: the time-limit signal
submitit asks SLURM for (USR2) is a preemption on submitit's tasks and a stack dump everywhere else."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gyre_hpc.errors import ConfigError
from gyre_hpc.lifecycle import rank_signals
from gyre_hpc.lifecycle.recovery import requeue_countdown

ROOT = Path(__file__).resolve().parents[2]
SUBMITIT = {"SUBMITIT_EXECUTOR": "slurm"}

RANK = textwrap.dedent("""
    import signal, sys
    from pathlib import Path
    from gyre_hpc.live.rank import _traceback_on_signal, early_preemption
    p = early_preemption(rank=True)
    trace = Path(sys.argv[1])
    _traceback_on_signal(trace)
    for name in sys.argv[2:]:
        signal.raise_signal(signal.Signals[name])
    p.ignore()
    dumped = trace.is_file() and "most recent call first" in trace.read_text()
    print(p.signal, "dumped" if dumped else "no-dump")
""")


def child_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SUBMITIT_EXECUTOR", "SUBMITIT_PREEMPT_SIGNAL", "GYRE_LAUNCHED", "GYRE_SBATCH_LAUNCHED")}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


def run_rank_child(tmp_path, env: dict, *signals: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RANK, str(tmp_path / "rank0.txt"), *signals], capture_output=True,
                          text=True, env=child_env(env), timeout=120)


def test_everywhere_but_submitit_sigterm_and_sigusr1_preempt_and_sigusr2_dumps_the_stacks():
    for env in ({}, {"SUBMITIT_EXECUTOR": "local"}, {"SUBMITIT_PREEMPT_SIGNAL": "USR2"}):
        sigs = rank_signals.decide(env)
        assert (sigs.path, sigs.preempt, sigs.time_limit, sigs.dump) == ("default", ("SIGTERM", "SIGUSR1"), None,
                                                                         "SIGUSR2")
        assert sigs.service_ignored == ("SIGUSR1",) and not sigs.is_time_limit("SIGUSR2")


def test_on_submitits_slurm_tasks_its_time_limit_signal_preempts_and_the_dump_moves_to_sigquit():
    sigs = rank_signals.decide(SUBMITIT)
    assert sigs.path == "submitit" and sigs.preempt == ("SIGTERM", "SIGUSR1", "SIGUSR2")
    assert sigs.time_limit == "SIGUSR2" and sigs.is_time_limit("SIGUSR2") and not sigs.is_time_limit("SIGUSR1")
    assert sigs.dump == "SIGQUIT" and sigs.service_ignored == ("SIGUSR1", "SIGUSR2")


@pytest.mark.parametrize("name, preempt, dump", [("USR1", ("SIGTERM", "SIGUSR1"), "SIGUSR2"),
                                                 ("TERM", ("SIGTERM", "SIGUSR1"), "SIGUSR2"),
                                                 ("QUIT", ("SIGTERM", "SIGUSR1", "SIGQUIT"), "SIGUSR2")])
def test_another_submitit_signal_is_the_time_limit_and_the_dump_takes_a_signal_that_means_nothing_else(
        name, preempt, dump):
    sigs = rank_signals.decide({**SUBMITIT, "SUBMITIT_PREEMPT_SIGNAL": name})
    assert (sigs.preempt, sigs.time_limit, sigs.dump) == (preempt, "SIG" + name, dump)
    assert sigs.dump not in sigs.preempt and "SIGTERM" not in sigs.service_ignored


def test_an_unknown_submitit_signal_is_a_config_error_naming_the_variable():
    with pytest.raises(ConfigError, match="SUBMITIT_PREEMPT_SIGNAL='NOPE'"):
        rank_signals.decide({**SUBMITIT, "SUBMITIT_PREEMPT_SIGNAL": "NOPE"})


@pytest.mark.parametrize("chosen", [None, "USR1"])
def test_the_time_limit_signal_is_the_one_submitits_own_sbatch_asks_slurm_for(tmp_path, chosen):
    code = textwrap.dedent("""
        import os, re
        from submitit.core.job_environment import JobEnvironment
        from submitit.slurm.slurm import _make_sbatch_string
        from gyre_hpc.lifecycle import rank_signals
        text = _make_sbatch_string(command="true", folder=os.environ["FOLDER"], signal_delay_s=42)
        asked = re.search(r"#SBATCH --signal=(\\w+)@42", text).group(1)
        print("SIG" + asked, "SIG" + JobEnvironment.USR_SIG, rank_signals.decide({**os.environ,
              "SUBMITIT_EXECUTOR": "slurm"}).time_limit)
    """)
    env = child_env({"FOLDER": str(tmp_path), **({"SUBMITIT_PREEMPT_SIGNAL": chosen} if chosen else {})})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    asked, job_side, ours = done.stdout.split()
    assert asked == job_side == ours == "SIG" + (chosen or "USR2")


def test_a_submitit_rank_takes_the_time_limit_signal_for_a_preemption_and_dumps_its_stacks_on_sigquit(tmp_path):
    done = run_rank_child(tmp_path, SUBMITIT, "SIGUSR2", "SIGQUIT")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SIGUSR2", "dumped"]


def test_a_submitit_ranks_time_limit_signal_alone_dumps_nothing(tmp_path):
    done = run_rank_child(tmp_path, SUBMITIT, "SIGUSR2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SIGUSR2", "no-dump"]


def test_any_other_rank_dumps_its_stacks_on_sigusr2_and_is_preempted_by_sigusr1_only(tmp_path):
    done = run_rank_child(tmp_path, {}, "SIGUSR2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "dumped"]
    done = run_rank_child(tmp_path, {}, "SIGUSR1")
    assert done.stdout.split()[0] == "SIGUSR1"


@pytest.mark.parametrize("env, survives", [(SUBMITIT, True), ({}, False)])
def test_a_service_on_submitits_tasks_ignores_the_time_limit_signal_from_its_first_instruction(env, survives):
    """Engines and the proxy (``children.ignore_preemption_signal``, their ``preexec_fn``): SLURM's USR2 before the
    time limit reaches every process of the step; only the ranks act on it."""
    code = textwrap.dedent("""
        import signal, subprocess, sys
        from gyre_hpc.engines.children import ignore_preemption_signal
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"],
                                preexec_fn=ignore_preemption_signal)
        proc.send_signal(signal.SIGUSR2)  # at once: the interpreter is still starting
        print(proc.wait(60))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(env),
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == (0 if survives else -signal.SIGUSR2)


def test_only_the_time_limit_signal_spends_one_of_submitits_timeouts():
    sigs = rank_signals.decide(SUBMITIT)
    assert requeue_countdown(3, "SIGUSR2", sigs) == 2
    assert requeue_countdown(3, "SIGUSR1", sigs) == 3 and requeue_countdown(3, "SIGTERM", sigs) == 3
    assert requeue_countdown(0, "SIGUSR2", sigs) == -1  # out of timeouts: not requeued
    assert requeue_countdown(0, "SIGUSR2", rank_signals.decide({})) == 0
