"""``gyre train`` refuses what it cannot do before any rank starts, in one line, with nothing written: a resume
whose files are incomplete (the run directory stays byte for byte as it was), an unwritable ``run.out_dir``, absurd
geometry. A finished run has nothing to resume. (jobs/train.py ``_resumable``, gyre_hpc.lifecycle.resume ``check_files``.)"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gyre_hpc.lifecycle import resume
from gyre_hpc.config import load_config, to_dict

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "local.yaml"
OVERRIDES = ["cluster.cells=2", "allocator.steps=4"]


def gyre(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM", "PMI_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(CONFIG)]
    cmd += [a for o in OVERRIDES for a in ("--set", o)] + list(args)  # later --set options win
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def tree_digest(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its content hash and mode (directories too)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        data = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = f"{data}:{oct(st.st_mode)}:{st.st_mtime_ns}"
    return out


@pytest.fixture
def preempted_run(tmp_path):
    """A run directory as a preemption at step 2 leaves it (the files a resume reads, with the right names)."""
    run = tmp_path / "preempt-20260101-000000"
    (run / "tito").mkdir(parents=True)
    (run / "weights").mkdir()
    cfg = load_config(str(CONFIG), [*OVERRIDES, f"run.out_dir={tmp_path}"])
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    (run / "metrics.jsonl").write_text('{"version": 1}\n{"version": 2}\n')
    (run / "weights" / "LATEST.json").write_text('{"version": 2}\n')
    (run / "tito" / "q00004.jsonl").write_text("{}\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "meta.json").write_text(json.dumps({"version": 2, "world_size": 1}))
    header = b'{"__metadata__":{}}'
    (ckpt / "rank000.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (ckpt / "rank000.state.pt").write_bytes(b"PK\x03\x04" + b"\0" * 60)  # the zip container of torch.save
    steps = [{"version": v, "staleness_mean": 0.5, "gids": [2 * v - 2, 2 * v - 1]} for v in (1, 2)]
    state = {"version": 2, "sched": {"version": 2, "steps_done": 2, "trained_batches": 2, "lag_sum": 1.0,
                                     "admitted_queries": 6},
             "steps": steps, "buffer": [{"gid": 4, "tito": str(run / "tito" / "q00004.jsonl"), "runs": 2,
                                         "trained_tokens": 10, "gen_versions": [1], "ready_version": 2}],
             "next_gid": 6, "inflight": [5], "counters": {"segments": 1, "groups": [], "build_errors": []}}
    resume.save(run, state, ckpt)
    return run


@pytest.mark.parametrize("missing", ["resume/checkpoint/rank000.state.pt", "resume/checkpoint/rank000.safetensors",
                                     "tito/q00004.jsonl"])
def test_a_resume_missing_a_file_fails_in_one_line_before_mpi_and_leaves_the_run_dir_untouched(preempted_run,
                                                                                                 missing):
    (preempted_run / missing).unlink()
    before = tree_digest(preempted_run)
    done = gyre("--resume", str(preempted_run), "--set", f"run.out_dir={preempted_run.parent}")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and Path(missing).name in lines[0] and "missing" in lines[0], done.stderr
    assert tree_digest(preempted_run) == before


@pytest.mark.parametrize("damaged,why", [("resume/checkpoint/rank000.safetensors", "not a safetensors file"),
                                         ("resume/checkpoint/rank000.state.pt", "not a torch.save zip file")])
def test_a_resume_with_a_damaged_checkpoint_file_fails_in_one_line_and_leaves_the_run_dir_untouched(
        preempted_run, damaged, why):
    (preempted_run / damaged).unlink()  # a hard link: replace it, not the checkpoint it shares bytes with
    (preempted_run / damaged).write_bytes(b"\x80\x04garbage that is no checkpoint")
    before = tree_digest(preempted_run)
    done = gyre("--resume", str(preempted_run), "--set", f"run.out_dir={preempted_run.parent}")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0], done.stderr
    assert tree_digest(preempted_run) == before


def test_a_finished_run_has_nothing_to_resume(tmp_path):
    run = tmp_path / "done"
    run.mkdir()
    (run / "summary.json").write_text("{}\n")
    before = tree_digest(run)
    done = gyre("--resume", str(run))
    assert done.returncode == 0 and "nothing to resume" in done.stderr
    assert tree_digest(run) == before


def test_an_unwritable_out_dir_is_one_line_and_nothing_is_created(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    done = gyre("--set", f"run.out_dir={blocker}/runs")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gyre train: error: run.out_dir: cannot create"), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.parametrize("key,value", [("cluster.cells", 100000), ("cluster.nodes_per_cell", 10**6),
                                       ("cluster.gpus_per_node", 4096)])
def test_absurd_geometry_is_refused_up_front_with_the_dotted_key(key, value):
    done = gyre("--dry-run", "--set", f"{key}={value}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"gyre train: error: {key}: must be <= "
                                                f"{done.stderr.split('<= ')[1].split(',')[0]}, got {value}"]
