"""``gyre sweep --simulate`` on the real local SLURM cluster: one job array, results.csv / results.md / plot.png,
a failing element reported (exit 1) while the others complete, and bad input refused before any submission."""
import csv
import subprocess
import uuid
import warnings

import pytest

from gyre_hpc.cli import main
from slurm_cluster import ROOT, local_slurm  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm]
SMALL = str(ROOT / "configs" / "sim" / "small.yaml")
FAST = ["--set", "sim.steps=4"]


def rows(out):
    return list(csv.DictReader((out / "results.csv").open()))


def test_a_simulate_sweep_is_one_job_array_with_a_table_a_plot_and_its_failures(local_slurm, tmp_path, capsys):
    """Four elements in one array; sim.max_events=50 makes two of them fail inside the job (a SchedulingError
    raised by the simulator), the other two complete: the failures are in the table and the exit status is 1."""
    out = tmp_path / "sw"
    code = main(["sweep", SMALL, "--simulate", *FAST, "--grid", "scheduler.staleness_target=1,2",
                 "--grid", "sim.max_events=5000000,50", "--out", str(out)])
    assert code == 1, capsys.readouterr().err
    got = rows(out)
    assert [(r["scheduler.staleness_target"], r["sim.max_events"], r["status"]) for r in got] == [
        ("1", "5000000", "COMPLETED"), ("1", "50", "FAILED"), ("2", "5000000", "COMPLETED"), ("2", "50", "FAILED")]
    assert len({r["job"].split("_")[0] for r in got}) == 1  # one job array
    assert [r["job"].split("_")[1] for r in got] == ["0", "1", "2", "3"]
    ok, failed = [got[0], got[2]], [got[1], got[3]]
    assert all(float(r["gyre_hours"]) > 0 and float(r["gyre_vs_colocate"]) > 0 and r["error"] == "" for r in ok)
    assert ok[0]["gyre_hours"] != ok[1]["gyre_hours"]  # the staleness target changes the simulation
    assert all("SchedulingError: gyre: more than sim.max_events=50 events" in r["error"] and r["gyre_hours"] == ""
               for r in failed)
    md = (out / "results.md").read_text()
    assert "2 of 4 elements completed." in md and "- element 1 (FAILED):" in md and "- element 3 (FAILED):" in md
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "2 completed, 2 failed" in capsys.readouterr().out


@pytest.mark.mpi
@pytest.mark.megatron
@pytest.mark.mooncake
@pytest.mark.slow
def test_a_training_sweep_runs_one_live_training_per_element_and_tabulates_their_summaries(local_slurm, tmp_path,
                                                                                              capsys):
    """Without --simulate each element is a live training (1 + K tasks, one pmix world) of the array; the table
    has each run's own summary: the grid value reached the run (its step count) and nothing was lost."""
    short = ["cluster.cells=2", "scheduler.batch_groups=2", "agent.runs_per_group=4", "agent.turns=[1, 2]",
             "scheduler.mu=1", "train.epochs=1", "engine.startup_timeout_s=600", "allocator.hello_timeout_s=600",
             "engine.sleep_in_training=true",  # no engine restart per switch (CPU); restarts: test_live_training
             "engine.kv_cache=false"]  # as written: configs/local_4node.yaml turned it on (issue 31)
    for attempt in range(2):
        out = tmp_path / f"sw{attempt}"
        code = main(["sweep", str(ROOT / "configs" / "local_4node.yaml"), "--grid", "allocator.steps=1,2",
                     *[a for o in short for a in ("--set", o)], "--out", str(out)])
        errors = "".join(p.read_text() for p in out.glob("submitit/*.err"))
        if code != 0 and "Segmentation fault" in errors:  # Open MPI's known MPI_Init crash (docs/slurm-local.md)
            warnings.warn("Open MPI crashed in MPI_Init under srun --mpi=pmix (known defect); sweeping again")
            continue
        break
    assert code == 0, capsys.readouterr().err
    got = rows(out)
    assert [(r["allocator.steps"], r["status"], r["steps"], r["runs_lost"]) for r in got] == [
        ("1", "COMPLETED", "1", "0"), ("2", "COMPLETED", "2", "0")]
    assert len({r["job"].split("_")[0] for r in got}) == 1  # one job array
    assert all((out / f"e00{i}" / "summary.json").is_file() and float(got[i]["wall_s"]) > 0 for i in range(2))


def jobs_named(name):
    """Every job the cluster knows by this name (queue and finished, through the sacct stand-in)."""
    listed = subprocess.run(["sacct", "-o", "JobName", "-P", "-n"], capture_output=True, text=True, check=True)
    queued = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, check=True)
    return [n for n in listed.stdout.split() + queued.stdout.split() if n == name]


@pytest.mark.parametrize("args, message", [
    (["--grid", "trajectory.jmax=1,3"], "--grid trajectory.jmax: unknown config key; did you mean trajectory.j_max"),
    (["--grid", "scheduler.no_such_field=1"], "--grid scheduler.no_such_field: unknown config key"),
    (["--grid", "scheduler.staleness_target=1,-1"],
     "grid element 1 (staleness_target=-1): scheduler.staleness_target: must be >= 0"),
    (["--grid", "cluster.cells=4,1"], "grid element 1 (cells=1): cluster.cells: gyre needs at least 2 cells"),
])
def test_bad_sweeps_fail_before_anything_is_submitted(local_slurm, tmp_path, capsys, args, message):
    name = f"gyre-bad-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "sw"
    assert main(["sweep", SMALL, "--simulate", "--set", f"slurm.job_name={name}", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists() and jobs_named(name) == []


def test_a_missing_config_fails_before_anything_is_submitted(local_slurm, tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", str(tmp_path / "nope.yaml"), "--grid", "trajectory.j_max=1,3", "--out", str(out)]) == 2
    assert f"config file not found: {tmp_path / 'nope.yaml'}" in capsys.readouterr().err
    assert not out.exists()
