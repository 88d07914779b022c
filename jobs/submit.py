"""``gyre submit CONFIG``: render the sbatch script from the config and submit it (or print it with --dry-run).

::

    gyre submit CONFIG --dry-run     prints gyre_hpc.slurm.sbatch.render_sbatch(config) and exits 0
    gyre submit CONFIG               new run dir <run.out_dir>/<run.name>-TIMESTAMP with config.yaml and job.sbatch,
                                     then sbatch --parsable (GYRE_RUN_DIR and the log paths point into the run dir)
                                     and prints the job id

The config (with --set overrides) is loaded and the layout validated before anything is written or submitted;
then ``sbatch --test-only`` asks the cluster whether it can ever run the script (more nodes than the partition
has, GPUs it does not have): a refusal is a ``LayoutError`` naming the keys, and nothing is written or queued.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess

from gyre_hpc.config import GyreConfig, load_config
from gyre_hpc.errors import GyreError, LayoutError
from gyre_hpc.files.io import atomic_write_text
from gyre_hpc.models import run_init
from gyre_hpc.slurm.sbatch import render_sbatch
from jobs import add_overrides

DESCRIPTION = """\
Render the SLURM batch script of a training job from its config and submit it with sbatch.

  gyre submit configs/gyre_2p4t.yaml --dry-run          print the script (what sbatch/gyre_2p4t.sh holds)
  gyre submit configs/local_4node.yaml                  submit to the local emulated cluster
  gyre submit configs/gyre_122b.yaml --set slurm.partition=gpu --set slurm.time='"12:00:00"'
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config, e.g. configs/gyre_2p4t.yaml")
    add_overrides(p, "slurm.partition=gpu", "; passed on to the ranks' gyre train")
    p.add_argument("--dry-run", action="store_true", help="print the script instead of submitting it")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    script = render_sbatch(cfg, args.config, args.overrides)
    if args.dry_run:
        print(script, end="")
        return 0
    from gyre_hpc.slurm.layout import preflight

    preflight(cfg)  # the layout fits the model and the engines, before anything is written or submitted
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise GyreError("sbatch not found on PATH: submit from a SLURM login node (or start the local cluster: "
                        "scripts/local-slurm.sh start); --dry-run prints the script without submitting")
    _check_fits(sbatch, cfg, script)
    # the config written is resolved (RUN_DIR/model/init written first): a requeued job's resume check reads it
    run_dir, cfg = run_init.new_run(cfg, "gyre submit", absolute=True)
    atomic_write_text(run_dir / "job.sbatch", script)
    cmd = [sbatch, "--parsable", f"--output={run_dir}/slurm-%j.out", f"--error={run_dir}/slurm-%j.err",
           f"--export=ALL,GYRE_RUN_DIR={run_dir}", str(run_dir / "job.sbatch")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if done.returncode != 0:
        raise GyreError(f"sbatch refused the job (exit {done.returncode}): {done.stderr.strip()}; "
                        f"script: {run_dir / 'job.sbatch'}")
    job_id = done.stdout.strip().split(";")[0]
    atomic_write_text(run_dir / "job_id", job_id + "\n")
    print(f"submitted job {job_id}; run directory {run_dir}")
    return 0


def _check_fits(sbatch: str, cfg: GyreConfig, script: str) -> None:
    """``sbatch --test-only``: SLURM's own verdict on the script's resources, before anything is written."""
    done = subprocess.run([sbatch, "--test-only"], input=script, capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        return
    c, s = cfg.cluster, cfg.slurm
    why = " ".join(line.strip() for line in done.stderr.splitlines() if line.strip()) or f"exit {done.returncode}"
    raise LayoutError(f"the cluster cannot run this job ({why}): it asks for cluster.cells={c.cells} x "
                      f"cluster.nodes_per_cell={c.nodes_per_cell} = {c.cells * c.nodes_per_cell} nodes with "
                      f"cluster.gpus_per_node={c.gpus_per_node} GPUs each in slurm.partition="
                      f"{s.partition or '(default)'}; change those keys (sinfo shows what the cluster has)")
