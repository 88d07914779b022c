"""Against the real local SLURM cluster (scripts/local-slurm.sh: 4 emulated nodes) and real Open MPI + mpi4py:
batch jobs across nodes, pmix MPI worlds, the cell launch pattern of gyre_hpc.slurm.layout, submitit results
and failures (through the sacct stand-in), scancel, and the script's own start/stop."""
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gyre_hpc.config import ClusterConfig
from gyre_hpc.slurm.env import expand_hostlist
from gyre_hpc.slurm.layout import plan
from slurm_cluster import ROOT, local_slurm, mpirun, mpirun_env, sbatch, script  # noqa: F401  (fixtures)

PY = sys.executable
MPI_PROG = """
import json, os
from mpi4py import MPI
print("mpi-init-done", flush=True)
w = MPI.COMM_WORLD
total = w.allreduce(w.Get_rank())
mine = {"rank": w.Get_rank(), "size": w.Get_size(), "node": os.environ.get("SLURMD_NODENAME"), "sum": total}
everyone = w.gather(mine)  # one line from rank 0: mpirun may merge lines printed by several ranks
if w.Get_rank() == 0:
    print(json.dumps(everyone), flush=True)
"""
ENV_PROG = """
import json, os
from gyre_hpc.slurm.env import from_environ
e = from_environ()
print(json.dumps({"rank": e.proc_id, "node": e.node_name, "nodes": e.nodes, "job_nodes": e.job_nodes,
                  "ntasks": e.ntasks}), flush=True)
"""


#: Debian's Open MPI 4.1.4 started by ``srun --mpi=pmix`` across emulated nodes segfaults inside MPI_Init in about
#: 5 % of 4-rank starts (a NULL active-message callback called from mca_btl_tcp; docs/slurm-local.md); mpirun on
#: one host did not (0 of 80). Not our code: such a start is retried, at most twice, and only when a rank died
#: with this signature before every rank had printed "mpi-init-done".
OMPI_INIT_CRASH = "Signal: Segmentation fault (11)"


def mpi_sbatch(tmp_path, body, ranks, *args, timeout=60):
    for _ in range(3):
        run = sbatch(tmp_path, body, *args, timeout=timeout)
        if not (OMPI_INIT_CRASH in run.output and run.output.count("mpi-init-done") < ranks):
            return run
        warnings.warn(f"job {run.job_id}: Open MPI segfaulted inside MPI_Init (known defect, start retried)")
    return run


def records(run):
    """JSON records printed one per line (``{...}``) or as one gathered list (``[...]``), by rank."""
    assert run.returncode == 0, run.output
    got = [json.loads(line) for line in run.lines() if line[:1] in "{["]
    flat = [r for item in got for r in (item if isinstance(item, list) else [item])]
    return sorted(flat, key=lambda r: r["rank"])


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path / name


@pytest.mark.slurm
def test_sbatch_runs_one_task_on_each_emulated_node_and_env_parses_there(local_slurm, tmp_path):
    prog = write(tmp_path, "env.py", ENV_PROG)
    run = sbatch(tmp_path, f"srun {PY} {prog}", "-N4", "--ntasks-per-node=1")
    got = records(run)
    assert [(r["rank"], r["node"]) for r in got] == [(0, "n1"), (1, "n2"), (2, "n3"), (3, "n4")]
    assert all(r["nodes"] == r["job_nodes"] == ["n1", "n2", "n3", "n4"] and r["ntasks"] == 4 for r in got)


@pytest.mark.slurm
@pytest.mark.mpi
def test_srun_pmix_starts_one_mpi_world_across_four_nodes(local_slurm, tmp_path):
    prog = write(tmp_path, "mpi.py", MPI_PROG)
    got = records(mpi_sbatch(tmp_path, f"srun --mpi=pmix --kill-on-bad-exit=1 {PY} {prog}", 4, "-N4",
                             "--ntasks-per-node=1"))
    assert [r["rank"] for r in got] == [0, 1, 2, 3]
    assert all(r["size"] == 4 and r["sum"] == 6 for r in got)  # one world, not four single-rank worlds
    assert [r["node"] for r in got] == ["n1", "n2", "n3", "n4"]


@pytest.mark.slurm
@pytest.mark.mpi
def test_one_step_places_the_allocator_and_every_worker_where_the_layout_says(local_slurm, tmp_path):
    """One pmix world of 1 + 2 cells x 2 nodes x 2 workers, placed by control_srun_args: each rank checks its own
    placement (node, cell, worker) and the world's size (one worker per emulated GPU)."""
    cluster = ClusterConfig(cells=2, nodes_per_cell=2, workers_per_node=2)
    layout = plan(cluster, ("n1", "n2", "n3", "n4"))
    prog = write(tmp_path, "world.py", f"""
import json, os
from mpi4py import MPI
from gyre_hpc.config import ClusterConfig
from gyre_hpc.slurm.env import from_environ
from gyre_hpc.slurm.layout import plan_from_env
print("mpi-init-done", flush=True)
w = MPI.COMM_WORLD
placed = plan_from_env(ClusterConfig(cells=2, nodes_per_cell=2, workers_per_node=2),
                       from_environ()).placement_from_env(from_environ())
print(json.dumps({{"rank": w.Get_rank(), "size": w.Get_size(), "node": os.environ["SLURMD_NODENAME"],
                  "cell": None if placed.cell is None else placed.cell.index, "worker": placed.worker}}), flush=True)
""")
    body = f"srun {' '.join(layout.control_srun_args())} {PY} {prog}"
    got = records(mpi_sbatch(tmp_path, body, 9, "-N4", "--ntasks-per-node=1"))
    assert [(r["rank"], r["size"], r["node"], r["cell"], r["worker"]) for r in got] == [
        (0, 9, "n1", None, None), (1, 9, "n1", 0, 0), (2, 9, "n1", 0, 1), (3, 9, "n2", 0, 2), (4, 9, "n2", 0, 3),
        (5, 9, "n3", 1, 0), (6, 9, "n3", 1, 1), (7, 9, "n4", 1, 2), (8, 9, "n4", 1, 3)]


@pytest.mark.slurm
@pytest.mark.mpi
def test_a_rank_that_dies_ends_the_control_world_instead_of_hanging(local_slurm, tmp_path):
    """The others wait for a message that will never come (as the allocator waits for its cells); the step still
    ends at once and the job fails (control_srun_args' --kill-on-bad-exit=1; SLURM's pmix plugin also aborts a
    step when one of its processes dies)."""
    layout = plan(ClusterConfig(cells=2, nodes_per_cell=2), ("n1", "n2", "n3", "n4"))
    prog = write(tmp_path, "crash.py", """
import os
from mpi4py import MPI
print("mpi-init-done", flush=True)
import time
w = MPI.COMM_WORLD
w.Barrier()
if w.Get_rank() == 1:
    os._exit(3)
while not w.Iprobe(source=1):
    time.sleep(0.05)
""")
    start = time.time()
    run = mpi_sbatch(tmp_path, f"srun {' '.join(layout.control_srun_args())} {PY} {prog}", 3, "-N4",
                     "--ntasks-per-node=1", timeout=60)
    assert run.returncode != 0 and "task 1: Exited with exit code 3" in run.output, run.output
    assert time.time() - start < 30


@pytest.mark.mpi
def test_mpirun_oversubscribed_world_outside_slurm(mpirun, tmp_path):
    prog = write(tmp_path, "mpi.py", MPI_PROG)
    out = subprocess.run([mpirun, "--oversubscribe", "-n", "4", PY, str(prog)], capture_output=True, text=True,
                         env=mpirun_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    gathered = re.search(r"\[\{.*\}\]", out.stdout)  # rank 0's line; mpirun may run other ranks' output into it
    assert gathered, out.stdout
    got = sorted(json.loads(gathered.group(0)), key=lambda r: r["rank"])
    assert [(r["rank"], r["size"], r["sum"]) for r in got] == [(0, 4, 6), (1, 4, 6), (2, 4, 6), (3, 4, 6)]


@pytest.mark.slurm
def test_impossible_request_fails_at_submission_instead_of_pending(local_slurm, tmp_path):
    out = subprocess.run(["sbatch", "-N5", "--wrap", "true"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "Batch job submission failed" in out.stderr, out.stderr


@pytest.mark.slurm
def test_scancel_stops_a_running_job_and_its_processes(local_slurm, tmp_path):
    pid_file = tmp_path / "pid"
    job = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", f"echo $$ > {pid_file}; exec sleep 300"],
                         capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.time() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.time() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    subprocess.run(["scancel", job], check=True)
    while time.time() < deadline:
        state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        if "JobState=CANCELLED" in state and not os.path.exists(f"/proc/{pid}"):
            return
        time.sleep(0.05)
    pytest.fail(f"job {job} still {state.split('JobState=')[1].split()[0]}, pid {pid} alive: "
                f"{os.path.exists(f'/proc/{pid}')}")


# ------------------------------------------------------------------------------------------------ submitit
def executor(tmp_path, **params):
    import submitit

    ex = submitit.AutoExecutor(folder=tmp_path / "submitit")
    assert ex.cluster == "slurm"
    ex.update_parameters(timeout_min=5, **params)
    return ex


@pytest.mark.slurm
def test_submitit_job_returns_its_result(local_slurm, tmp_path):
    assert executor(tmp_path).submit(pow, 2, 10).result() == 1024


@pytest.mark.slurm
def test_submitit_multi_task_job_gives_each_task_its_rank_and_node(local_slurm, tmp_path):
    from slurm_cluster import rank_and_node

    job = executor(tmp_path, nodes=2, tasks_per_node=1).submit(rank_and_node)
    results = sorted(job.results())
    assert [(rank, size) for rank, size, _ in results] == [(0, 2), (1, 2)]
    # which two nodes depends on what earlier jobs still hold; the sacct stand-in reports the same ones
    assert tuple(node for _, _, node in results) == expand_hostlist(job.get_info()["NodeList"])


@pytest.mark.slurm
def test_submitit_job_raising_an_exception_raises_with_its_traceback(local_slurm, tmp_path):
    import submitit

    job = executor(tmp_path).submit(int, "not a number")
    with pytest.raises(submitit.core.utils.FailedJobError, match="invalid literal for int"):
        job.result()


@pytest.mark.slurm
def test_submitit_jobs_killed_without_a_result_raise_within_bounded_time(local_slurm, tmp_path):
    """No result file (a hard exit, a scancel): only sacct, here the stand-in, can tell submitit the job is
    over. After that submitit still waits 15 s for a late result file (slow shared filesystems) before it
    raises, so the two results are awaited in parallel."""
    import submitit
    from slurm_cluster import hard_exit

    def failure(job):
        with pytest.raises(submitit.core.utils.UncompletedJobError) as info:
            job.result()
        return str(info.value)

    ex = executor(tmp_path)
    crashed, cancelled = ex.submit(hard_exit, 3), ex.submit(time.sleep, 300)
    start = time.time()
    while cancelled.state != "RUNNING":
        time.sleep(0.1)
    cancelled.cancel()
    while not (crashed.done() and cancelled.done()):  # done() asks sacct: no result file will ever come
        assert time.time() - start < 30, f"submitit still sees {crashed.state} / {cancelled.state}"
        time.sleep(0.2)
    with ThreadPoolExecutor(2) as pool:
        crash_msg, cancel_msg = pool.map(failure, [crashed, cancelled])
    assert "has not produced any output (state: FAILED)" in crash_msg
    assert "has not produced any output (state: CANCELLED)" in cancel_msg
    assert time.time() - start < 60


# --------------------------------------------------------------------------------------- the sacct stand-in
def standin():
    path = str(ROOT / "scripts" / "sacct-standin")
    loader = importlib.machinery.SourceFileLoader("sacct_standin", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


@pytest.mark.slurm
def test_sacct_standin_answers_submitits_query_for_every_end_state(local_slurm, tmp_path):
    from submitit.slurm.slurm import SlurmInfoWatcher

    def submit(*args):
        return subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    ok, failed, array = submit("--wrap", "true"), submit("--wrap", "exit 3"), submit("--array=0-2", "--wrap", "true")
    cancelled = submit("--wrap", "sleep 300")
    subprocess.run(["scancel", cancelled], check=True)
    query = ["sacct", "-o", "JobID,State,NodeList", "--parsable2"]  # submitit 1.5.4's exact command
    for jid in (ok, failed, array, cancelled):
        query += ["-j", jid]
    wanted = {ok: "COMPLETED", failed: "FAILED", cancelled: "CANCELLED",
              **{f"{array}_{i}": "COMPLETED" for i in range(3)}}
    deadline = time.time() + 30
    while time.time() < deadline:
        info = SlurmInfoWatcher().read_info(subprocess.run(query, capture_output=True, text=True, check=True).stdout)
        if {k: info.get(k, {}).get("State") for k in wanted} == wanted:
            break
        time.sleep(0.1)
    assert {k: info.get(k, {}).get("State") for k in wanted} == wanted
    assert info[ok]["NodeList"] in ("n1", "n2", "n3", "n4")


@pytest.mark.slurm
def test_sacct_standin_remembers_finished_jobs_in_the_jobcomp_log(local_slurm, tmp_path):
    job = sbatch(tmp_path, "exit 4").job_id
    mod = standin()
    finished = {r["JobId"]: r for r in mod.jobcomp_records(mod.read_conf(str(local_slurm.conf)))}
    assert finished[str(job)]["JobState"] == "FAILED" and finished[str(job)]["ExitCode"] == "4:0"


@pytest.mark.slurm
def test_sacct_standin_defers_to_real_sacct_when_accounting_is_on(local_slurm, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(local_slurm.conf.read_text().replace("accounting_storage/none", "accounting_storage/slurmdbd"))
    out = subprocess.run([str(ROOT / "scripts" / "sacct-standin"), "-j", "1"], capture_output=True, text=True,
                         env={**os.environ, "SLURM_CONF": str(conf)}, timeout=60)
    assert "JobID" not in out.stdout and out.returncode != 0  # the real sacct cannot reach a slurmdbd


# ------------------------------------------------------------------------------------------------ the script
@pytest.mark.slurm
def test_start_is_idempotent_and_keeps_the_running_daemons(local_slurm):
    pids = {p.name: p.read_text() for p in (local_slurm.dir / "run").glob("*.pid")}
    out = script("start", timeout=60)
    assert out.returncode == 0 and "already running" in out.stdout, out.stdout + out.stderr
    assert {p.name: p.read_text() for p in (local_slurm.dir / "run").glob("*.pid")} == pids
    assert len(pids) == 2 + 4  # munged, slurmctld, slurmd n1..n4


@pytest.mark.slurm
def test_a_second_cluster_starts_from_scratch_and_stops_by_pid(local_slurm):
    links = {p: os.readlink(p) for p in ("/etc/slurm/slurm.conf", "/usr/local/bin/sacct") if os.path.islink(p)}
    tmp_path = Path(tempfile.mkdtemp(prefix="gyre-slurm-test-", dir="/tmp"))  # munged must reach it: not 0700
    tmp_path.chmod(0o755)
    env = {**os.environ, "GYRE_SLURM_DIR": str(tmp_path / "c2"), "GYRE_SLURM_PORT": "7817",
           "GYRE_SLURM_NODES": "2", "GYRE_SLURM_LINKS": "0", "SLURM_CONF": str(tmp_path / "c2/etc/slurm.conf")}
    out = script("start", env=env, timeout=120)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert script("status", env=env).stdout.split() == ["NODELIST", "STATE", "CPUS", "n1", "idle", "4",
                                                            "n2", "idle", "4"]
        pids = [int(p.read_text()) for p in (tmp_path / "c2" / "run").glob("*.pid")]
        assert len(pids) == 4
        job_pid = tmp_path / "job.pid"
        subprocess.run(["sbatch", "-o", "/dev/null", "--wrap", f"echo $$ > {job_pid}; exec sleep 300"], env=env,
                       check=True, capture_output=True)
        deadline = time.time() + 20
        while not (job_pid.exists() and job_pid.read_text().strip()) and time.time() < deadline:
            time.sleep(0.05)
        pids.append(int(job_pid.read_text()))  # a running job dies with the cluster
    finally:
        stop = script("stop", env=env, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert script("status", env=env).returncode == 3
    assert script("status").returncode == 0  # the session's cluster and its links are untouched
    assert {p: os.readlink(p) for p in links if os.path.islink(p)} == links
    shutil.rmtree(tmp_path)
