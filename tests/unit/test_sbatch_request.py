"""The sbatch script is its ranks' launcher: each trap writes RUN_DIR/preempt.request (the signal's name, whole)
BEFORE it forwards the signal to the step, and the ranks are told so (GYRE_SBATCH_LAUNCHED); a request an earlier
step or job left is removed before srun. The rendered script runs under bash with srun and scontrol replaced at
their boundary (doubles; the srun double records what the step would see)."""
import re
import signal
import subprocess
from pathlib import Path

import pytest

from gyre_hpc.config import load_config
from gyre_hpc.lifecycle.recovery import REQUEST_FILE, SBATCH_ENV
from gyre_hpc.slurm.sbatch import SCRIPTS, render_sbatch
from test_sbatch import run_rendered_script

ROOT = Path(__file__).resolve().parents[2]

#: srun double: notes its environment and the run dir at start; on USR1/TERM it records what RUN_DIR/preempt.request
#: held at that moment ("none" if absent), then saves and exits 75 as preempted ranks do
NOTING_SRUN = f"""#!/bin/bash
seen() {{ {{ cat "$GYRE_RUN_DIR/{REQUEST_FILE}" 2>/dev/null || echo none; }} > "$GYRE_RUN_DIR/seen-$1"
         echo "{{}}" > "$GYRE_RUN_DIR/resume/state.json"; exit 75; }}
trap 'seen USR1' USR1
trap 'seen TERM' TERM
mkdir -p "$GYRE_RUN_DIR/resume"; echo "${{{SBATCH_ENV}:-unset}}" > "$GYRE_RUN_DIR/env"
ls -A "$GYRE_RUN_DIR" > "$GYRE_RUN_DIR/at-start"; touch "$GYRE_RUN_DIR/step-running"
while true; do sleep 0.05; done
"""


def traps(text: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for m in re.finditer(r"^trap '(.*)' (\w+)$", text, re.M)}


@pytest.mark.parametrize("sig", ["USR1", "TERM"])
def test_every_trap_writes_the_request_before_it_forwards_the_signal(sig):
    text = render_sbatch(load_config(None, [f"slurm.signal={sig}@60"]), "c.yaml")
    got = traps(text)
    assert set(got) == ({"USR1", "TERM"} if sig == "USR1" else {"TERM"})
    for name, body in got.items():
        assert body.index(f"preempt_request {name};") < body.index(f"kill -s {name} $STEP"), body
    assert f"export {SBATCH_ENV}=1" in text.splitlines()
    assert text.index(f"export {SBATCH_ENV}=1") < text.index("\nsrun ")


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_the_checked_in_scripts_write_the_request_file_the_ranks_poll(script):
    text = (ROOT / script).read_text()
    assert f'mv -f "$RUN_DIR/{REQUEST_FILE}.tmp" "$RUN_DIR/{REQUEST_FILE}"' in text
    assert all("preempt_request" in body for body in traps(text).values())


def start_job(tmp_path: Path, stale: bool = False) -> tuple[subprocess.Popen, Path]:
    if stale:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / REQUEST_FILE).write_text("SIGUSR1\n")  # an earlier job's, served
    return run_rendered_script(tmp_path, NOTING_SRUN, ["run.max_relaunches=0"], wait_for_step=True)


@pytest.mark.parametrize("sig", ["USR1", "TERM"])
def test_the_step_finds_the_request_already_written_when_the_signal_reaches_it(tmp_path, sig):
    proc, run_dir = start_job(tmp_path)
    proc.send_signal(getattr(signal, f"SIG{sig}"))
    _, err = proc.communicate(timeout=60)
    assert (run_dir / f"seen-{sig}").read_text() == f"SIG{sig}\n", err
    assert (run_dir / "env").read_text() == "1\n"  # the ranks know their launcher writes the request
    assert not (run_dir / f"{REQUEST_FILE}.tmp").exists()


def test_a_request_an_earlier_job_left_is_removed_before_srun(tmp_path):
    proc, run_dir = start_job(tmp_path, stale=True)
    try:
        assert (run_dir / "at-start").is_file()
        assert REQUEST_FILE not in (run_dir / "at-start").read_text().split()
    finally:
        proc.send_signal(signal.SIGUSR1)
        proc.communicate(timeout=60)
