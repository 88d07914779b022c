"""gyre_hpc.slurm.sbatch: the checked-in scripts are what the renderer gives; bad slurm settings fail by key."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError, LayoutError
from gyre_hpc.launcher.slurm_options import EXTRA_OPTIONS
from gyre_hpc.slurm.sbatch import SCRIPTS, node_count, render_sbatch

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python -m gyre_hpc.slurm.sbatch --write"


def directives(text: str) -> dict[str, str]:
    return dict((m.group(1), m.group(2)) for m in re.finditer(r"^#SBATCH --([a-z-]+)(?:=(.*))?$", text, re.M))


@pytest.mark.parametrize("script,config", sorted(SCRIPTS.items()))
def test_checked_in_script_equals_the_rendered_config(script, config):
    rendered = render_sbatch(load_config(ROOT / config), config)
    assert (ROOT / script).read_text() == rendered, f"{script} is stale: regenerate with `{REGENERATE}`"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_checked_in_script_is_valid_bash(script):
    done = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_production_script_asks_for_192_nodes_with_8_gpus_and_launches_one_world_of_1537_ranks():
    text = (ROOT / "sbatch/gyre_2p4t.sh").read_text()
    d = directives(text)
    assert d["nodes"] == "192" and d["gpus-per-node"] == "8" and d["ntasks-per-node"] == "1"
    assert d["time"] == "48:00:00" and d["signal"] == "B:USR1@600" and "requeue" in d
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert "--ntasks=1537" in srun and "--mpi=pmix" in srun  # the allocator + one worker per GPU and '--nodelist="$RANK_NODES"' in srun
    assert "OMPI_MCA" not in text  # loopback settings are for the local cluster only


def test_local_script_exports_loopback_settings_and_no_gpus():
    text = (ROOT / "sbatch/local_4node.sh").read_text()
    assert "export OMPI_MCA_btl_tcp_if_include=lo" in text
    assert "gpus-per-node" not in directives(text) and directives(text)["nodes"] == "4"


@pytest.mark.parametrize("cells,npc", [(4, 48), (3, 2), (1, 1)])
def test_node_count_is_cells_times_nodes_per_cell(cells, npc):
    cfg = load_config(None, [f"cluster.cells={cells}", f"cluster.nodes_per_cell={npc}"])
    assert node_count(cfg) == cells * npc
    text = render_sbatch(cfg, "c.yaml")
    assert directives(text)["nodes"] == str(cells * npc)
    assert f"--ntasks={cells * npc + 1} " in text  # CPU cells: one worker per node
    assert 'for N in "${NODES[@]}"; do for ((w = 0; w < 1; w++)); do RANK_NODES+=",$N"; done; done' in text


def test_unset_partition_account_and_mem_write_no_directive_and_set_ones_do():
    bare = directives(render_sbatch(load_config(None), "c.yaml"))
    assert not {"partition", "account", "mem"} & set(bare)
    cfg = load_config(None, ["slurm.partition=gpu", "slurm.account=proj1", "slurm.mem=512G",
                             "slurm.extra=[--qos=high, --exclusive]", "slurm.requeue=false"])
    d = directives(render_sbatch(cfg, "c.yaml"))
    assert (d["partition"], d["account"], d["mem"], d["qos"]) == ("gpu", "proj1", "512G", "high")
    assert "exclusive" in d and "no-requeue" in d and "requeue" not in d


def test_overrides_reach_the_ranks_command_line_quoted():
    cfg = load_config(None, ["allocator.steps=3"])
    text = render_sbatch(cfg, "my configs/x.yaml", ["allocator.steps=3"])
    assert "train 'my configs/x.yaml' --run-dir \"$RUN_DIR\" --set allocator.steps=3 \"$@\" &" in text


def test_the_scripts_own_arguments_reach_gyre_train_after_the_config_overrides(tmp_path):
    """``sbatch SCRIPT --set a.b=c --json``: "$@" ends the ranks' command, each argument one word."""
    text = render_sbatch(load_config(None), "c.yaml", ["allocator.steps=3"])
    (srun,) = [i for i, line in enumerate(text.splitlines()) if line.startswith("srun ")]
    command = text.splitlines()[srun + 1].rstrip(" &")
    script = tmp_path / "echo.sh"
    script.write_text(f'RUN_DIR=r\nfor a in {command.replace("python3 -m gyre_hpc.cli", "")}; do echo "[$a]"; done\n')
    done = subprocess.run(["bash", str(script), "--set", "agent.turns=[1, 2]", "--json"], capture_output=True,
                          text=True, check=True)
    assert done.stdout.split("\n")[-6:-1] == ["[--set]", "[allocator.steps=3]", "[--set]", "[agent.turns=[1, 2]]",
                                              "[--json]"]


def test_render_is_pure_same_input_same_text():
    cfg = load_config(ROOT / "configs/gyre_122b.yaml")
    assert render_sbatch(cfg, "a.yaml") == render_sbatch(cfg, "a.yaml")


def test_unknown_sbatch_option_is_rejected_with_the_valid_list():
    with pytest.raises(ConfigError, match=r"slurm\.extra\[1\]: --bogus is not an accepted sbatch option; valid: ") as e:
        load_config(None, ["slurm.extra=[--qos=high, --bogus=1]"])
    assert all(opt in str(e.value) for opt in EXTRA_OPTIONS)


def test_option_written_from_the_config_is_rejected_with_the_field_to_set():
    with pytest.raises(ConfigError, match=r"slurm\.extra\[0\]: --time is written from the config: set slurm\.time"):
        load_config(None, ["slurm.extra=[--time=01:00:00]"])


@pytest.mark.parametrize("value", ["1:00:00:00", "10:60:00", "10:00:99", "00:00:00", "ten", "10-00:00"])
def test_bad_time_is_rejected_naming_slurm_time(value):
    with pytest.raises(ConfigError, match=r"^slurm\.time: .*HH:MM:SS|^slurm\.time: .*zero"):
        load_config(None, [f"slurm.time='{value}'"])


@pytest.mark.parametrize("value", ["USR1", "USR1@", "FOO@300", "USR1@70000", "usr1@300", "@300"])
def test_bad_signal_is_rejected_naming_slurm_signal(value):
    with pytest.raises(ConfigError, match=r"^slurm\.signal: .*SIG@seconds"):
        load_config(None, [f"slurm.signal='{value}'"])


@pytest.mark.parametrize("override,key", [("slurm.exports=[NOEQUALS]", "slurm.exports[0]"),
                                          ("slurm.mem=lots", "slurm.mem"), ("slurm.cpus_per_task=0",
                                                                            "slurm.cpus_per_task"),
                                          ("slurm.job_name=''", "slurm.job_name")])
def test_other_bad_slurm_values_name_their_key(override, key):
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: "):
        load_config(None, [override])


def test_layout_that_does_not_fit_fails_before_rendering():
    cfg = load_config(None, ["cluster.gpus_per_node=8", "cluster.tensor_parallel=3"])
    with pytest.raises(LayoutError, match="cluster.tensor_parallel=3 does not divide cluster.gpus_per_node=8"):
        render_sbatch(cfg, "c.yaml")


def gyre(*args, env=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM", "PMI_"))}
    return subprocess.run([sys.executable, "-m", "gyre_hpc.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**clean, **(env or {})}, timeout=60)


def test_gyre_submit_dry_run_prints_the_production_script():
    done = gyre("submit", "configs/gyre_2p4t.yaml", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (ROOT / "sbatch/gyre_2p4t.sh").read_text()


def test_gyre_submit_without_sbatch_on_path_is_a_clear_error(tmp_path):
    done = gyre("submit", "configs/local_4node.yaml", "--set", f"run.out_dir={tmp_path}",
                env={"PATH": str(Path(sys.executable).parent)})
    assert done.returncode == 2 and "sbatch not found on PATH" in done.stderr
    assert not list(tmp_path.iterdir())  # nothing written when it cannot submit


def test_gyre_train_dry_run_prints_the_local_layout_and_starts_nothing(tmp_path):
    done = gyre("train", "configs/local.yaml", "--dry-run", "--set", f"run.out_dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "rank 0 on local1: allocator (CPU only)" in done.stdout
    assert [ln.strip() for ln in lines if ln.strip().startswith("cell ")] == [
        f"cell {k}: ranks {k + 1}-{k + 1} on local{k + 1} (leader: rank {k + 1}); 1 worker(s), 0 GPUs, 1 training "
        f"replica(s)" for k in range(4)]
    assert "pre-flight: ok" in lines
    assert lines[-1].strip().startswith("mpirun --oversubscribe --bind-to none -n 5 ")
    assert not list(tmp_path.iterdir())  # no run directory, no process


def test_gyre_train_dry_run_inside_an_allocation_uses_the_job_nodes():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-32]", "SLURM_GPUS_ON_NODE": "8"}
    done = gyre("train", "configs/gyre_122b.yaml", "--dry-run", env=env)
    assert done.returncode == 0, done.stderr
    assert "cell 1: ranks 65-128 on gpu09,gpu10,gpu11,gpu12,gpu13,gpu14,gpu15,gpu16 (leader: rank 65)" in done.stdout
    assert "cell 3: ranks 193-256 on gpu25,gpu26,gpu27,gpu28,gpu29,gpu30,gpu31,gpu32 (leader: rank 193); " \
           "64 worker(s), 64 GPUs, 2 training replica(s)" in done.stdout
    nodes = ",".join(["gpu01"] + [f"gpu{n:02d}" for n in range(1, 33) for _ in range(8)])
    assert f"srun --ntasks=257 --distribution=arbitrary --nodelist={nodes} " in done.stdout
    assert "pre-flight: refused: cluster.pipeline_parallel=4: the live trainer runs no pipeline" in done.stdout


def test_gyre_train_dry_run_with_too_few_job_nodes_fails_with_the_fix():
    done = gyre("train", "configs/gyre_122b.yaml", "--dry-run",
                env={"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-24]"})
    assert done.returncode == 2 and "submit with -N32 or set cluster.cells=3" in done.stderr


@pytest.mark.parametrize("requeue,max_requeues,requeues", [(True, 3, True), (True, 0, False), (False, 3, False)])
def test_script_requeues_itself_only_on_the_preempted_status_when_configured(requeue, max_requeues, requeues):
    cfg = load_config(None, [f"slurm.requeue={str(requeue).lower()}", f"slurm.max_requeues={max_requeues}"])
    text = render_sbatch(cfg, "c.yaml")
    assert ("scontrol requeue \"$SLURM_JOB_ID\"" in text) == requeues
    assert ("open-mode" in directives(text)) == requeue  # a requeued job appends to its logs
    assert "if (( RC == 75 ))" in text and text.rstrip().endswith('exit "$RC"')
    if requeues:
        assert f"(( ! CANCELLED && ${{SLURM_RESTART_COUNT:-0}} < {max_requeues} ))" in text
    else:
        assert "gyre train c.yaml --resume $RUN_DIR" in text


def test_negative_max_requeues_is_refused_by_key():
    with pytest.raises(ConfigError, match="slurm.max_requeues"):
        load_config(None, ["slurm.max_requeues=-1"])


FAKE_SRUN = """#!/bin/bash
trap 'echo "{}" > "$GYRE_RUN_DIR/resume/state.json"; exit 75' USR1 TERM
mkdir -p "$GYRE_RUN_DIR/resume"; touch "$GYRE_RUN_DIR/step-running"
while true; do sleep 0.05; done
"""
FAKE_SCONTROL = """#!/bin/bash
if [[ "$1" == show ]]; then for ((i = 1; i <= NODES; i++)); do echo "n$i"; done; exit 0; fi
echo "$*" >> "$GYRE_RUN_DIR/scontrol.log"
"""


def run_rendered_script(tmp_path: Path, srun: str, overrides=(), wait_for_step: bool = False, env=None):
    """The script rendered from the embedded config (+ ``overrides``) started under bash, with srun (``srun``: a
    double's text) and scontrol (FAKE_SCONTROL) replaced at their boundary and python3 this interpreter; with
    ``wait_for_step``, returned once the srun double touched RUN_DIR/step-running; ``env``: more variables for the
    batch shell. Returns (process, RUN_DIR)."""
    import time

    cfg = load_config(None, ["slurm.signal=USR1@60", *overrides])
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    run_dir.mkdir(exist_ok=True)
    for name, text in (("srun", srun), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)  # slurm.python: this interpreter, this worktree's package
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(cfg, "c.yaml"))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GYRE_RUN_DIR": str(run_dir), "SLURM_JOB_ID": "7",
           "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_NODELIST": "n[1-9]", "NODES": str(node_count(cfg)),
           "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen(["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while wait_for_step and not (run_dir / "step-running").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    return proc, run_dir


@pytest.mark.parametrize("signal_name,requeued,code", [("USR1", True, 0), ("TERM", False, 75)])
def test_a_preemption_signal_requeues_the_job_and_a_cancel_never_does(tmp_path, signal_name, requeued, code):
    """The rendered script under bash with srun and scontrol replaced at their boundary: USR1 to the batch shell
    (#SBATCH --signal=B:USR1@s) ends the step preempted and requeues; SIGTERM to the shell (plain scancel) ends it
    preempted too (the resume state is saved) but never requeues: a cancel stays cancelled."""
    import signal

    proc, run_dir = run_rendered_script(tmp_path, FAKE_SRUN, wait_for_step=True)
    proc.send_signal(getattr(signal, f"SIG{signal_name}"))
    _, err = proc.communicate(timeout=30)
    log = run_dir / "scontrol.log"
    assert (log.is_file() and "requeue 7" in log.read_text()) == requeued, err
    assert proc.returncode == code, err
    assert ("job 7 requeued (restart 1 of 3)" in err) == requeued
    assert ("continue with gyre train c.yaml --resume" in err) != requeued
