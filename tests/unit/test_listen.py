"""cluster.listen_interface: which interface each launch path binds (gyre_hpc.launcher.listen), the key's check at load, and
the lines the SLURM renderers write (the sbatch script runs under bash with srun and scontrol replaced at their
boundary: the srun double notes what srun itself and the step's tasks would get)."""
from __future__ import annotations

import json
import shlex

import pytest

from gyre_hpc.launcher import listen
from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.slurm.jobspec import setup_lines
from gyre_hpc.slurm.sbatch import render_sbatch
from test_sbatch import run_rendered_script


@pytest.mark.parametrize("setting,one_machine,expected", [
    (None, True, "lo"), (None, False, ""), ("", True, ""), ("", False, ""), ("ib0", False, "ib0"), ("eth0", True, "eth0"),
])
def test_null_is_loopback_only_where_the_whole_job_is_on_one_machine(setting, one_machine, expected):
    assert listen.interface(setting, one_machine) == expected


@pytest.mark.parametrize("value", ["lo", "ib0", "eth0.100", "enp0s31f6", "", "abcdefghijklmno"])
def test_an_interface_name_loads(value):
    assert load_config(None, [f"cluster.listen_interface={json.dumps(value)}"]).cluster.listen_interface == value


@pytest.mark.parametrize("value,why", [
    ("abcdefghijklmnop", "at most 15 bytes"), ("a/b", "not an interface name"), ("e th0", "not an interface name"),
    ("..", "not an interface name"), ("a,b", "not an interface name"),
])
def test_a_bad_interface_name_fails_at_load_naming_the_key(value, why):
    with pytest.raises(ConfigError, match=rf"cluster\.listen_interface: .*{why}"):
        load_config(None, [f"cluster.listen_interface={json.dumps(value)}"])


def test_the_key_defaults_to_null():
    assert load_config(None, []).cluster.listen_interface is None


def test_the_lines_are_empty_when_off_and_otherwise_only_reach_the_steps_tasks():
    assert listen.batch_lines("", "python3") == []
    text = "\n".join(listen.batch_lines("ib0", "python3"))
    assert "export GYRE_LISTEN_INTERFACE=ib0" in text
    assert "export LD_PRELOAD" not in text and 'SLURM_EXPORT_ENV="${SLURM_EXPORT_ENV:-ALL},LD_PRELOAD=' in text
    assert "|| true" in text  # never fails a `set -euo pipefail` script


@pytest.mark.parametrize("overrides,expected", [
    ([], None),  # a real cluster: off unless configured
    (["slurm.local_cluster=true"], "lo"),
    (["slurm.local_cluster=true", 'cluster.listen_interface=""'], None),
    (["cluster.listen_interface=ib0"], "ib0"),
])
def test_the_renderers_write_the_shim_only_when_it_applies(overrides, expected):
    cfg = load_config(None, overrides)
    script = render_sbatch(cfg, "c.yaml")
    setup = "\n".join(setup_lines(cfg, "/runs/r"))
    for text in (script, setup):
        exported = [line for line in text.splitlines() if line.startswith(f"export {listen.ENV}=")]
        assert exported == ([f"export {listen.ENV}={expected}"] if expected else [])
        assert ("SLURM_EXPORT_ENV" in text) == bool(expected)
    if expected:
        assert script.index(f"export {listen.ENV}=") < script.index("\nsrun ")
        assert f"{shlex.quote(cfg.slurm.python)} -m gyre_hpc.live.bind_local" in script


#: srun double: what srun itself has, and what its tasks would have (SLURM_EXPORT_ENV is srun's --export: ALL plus
#: LD_PRELOAD); the task binds 0.0.0.0 and notes the address it got
NOTING_SRUN = """#!/bin/bash
echo "${LD_PRELOAD:-unset}" > "$GYRE_RUN_DIR/srun-preload"
echo "${SLURM_EXPORT_ENV:-unset}" > "$GYRE_RUN_DIR/srun-export"
preload="${SLURM_EXPORT_ENV##*,LD_PRELOAD=}"
LD_PRELOAD="$preload" python3 -c 'import socket; s = socket.socket(); s.bind(("0.0.0.0", 0)); print(s.getsockname()[0])' \
  > "$GYRE_RUN_DIR/task-bound"
"""


def test_the_batch_shell_builds_the_shim_and_hands_it_to_the_steps_tasks_not_to_srun(tmp_path):
    cache = tmp_path / "cache"
    proc, run_dir = run_rendered_script(tmp_path, NOTING_SRUN, ["run.max_relaunches=0", "slurm.local_cluster=true",
                                                                 "cluster.cells=2"], env={"XDG_CACHE_HOME": str(cache)})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (run_dir / "srun-preload").read_text().strip() == "unset"
    export = (run_dir / "srun-export").read_text().strip()
    assert export.startswith(f"ALL,LD_PRELOAD={cache}/gyre_hpc/bind_local-")
    assert (run_dir / "task-bound").read_text().strip() == "127.0.0.1"


def test_what_sbatchs_own_export_gave_the_steps_is_kept(tmp_path):
    proc, run_dir = run_rendered_script(tmp_path, NOTING_SRUN, ["run.max_relaunches=0", "slurm.local_cluster=true",
                                                                 "cluster.cells=2"],
                                        env={"XDG_CACHE_HOME": str(tmp_path / "cache"),
                                             "SLURM_EXPORT_ENV": "ALL,GYRE_RUN_DIR=/x"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (run_dir / "srun-export").read_text().startswith("ALL,GYRE_RUN_DIR=/x,LD_PRELOAD=")


def test_without_a_compiler_the_batch_script_runs_on_with_one_warning(tmp_path):
    proc, run_dir = run_rendered_script(tmp_path, NOTING_SRUN.replace("python3 -c", ": python3 -c"),
                                        ["run.max_relaunches=0", "slurm.local_cluster=true", "cluster.cells=2"],
                                        env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "CC": "no-such-cc"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (run_dir / "srun-export").read_text().strip() == "unset"
    assert err.count("no C compiler") == 1
