"""The sbatch script of a training job: a pure function of the config (``render_sbatch``), golden-tested.

What the script does on the cluster (docs/slurm.md)::

    #SBATCH lines            nodes = cluster.cells x cluster.nodes_per_cell, one task per node, GPUs, time, signal
    cd $SLURM_SUBMIT_DIR     the config path and relative output paths are relative to the submit directory
    RUN_DIR                  $GYRE_RUN_DIR (gyre submit sets it) or <run.out_dir>/<run.name>-<job id>
    RANK_NODES               first node (allocator), then every node once per worker (GPU): Layout.rank_nodes
    srun ... &               ONE pmix world of 1 + K x W ranks, one per GPU (Layout.control_srun_args) running
                             `python -m gyre_hpc.cli train CONFIG --run-dir RUN_DIR "$@"`; no Ray, MPI is the
                             rendezvous; the script's arguments go to gyre train (``sbatch SCRIPT --set a.b=c``)
    trap SIG/TERM            the batch shell is the ranks' launcher (it exports GYRE_SBATCH_LAUNCHED): it writes
                             RUN_DIR/preempt.request (the signal's name, as gyre train does), THEN forwards the
                             preemption signal (#SBATCH --signal=B:SIG@s) to the step; a SIGTERM to the shell
                             (scancel JOBID) is written and forwarded too and marks the job CANCELLED
    a rank lost              srun's --kill-on-bad-exit SIGTERMs the other ranks; with no request file rank 0 takes
                             it for the teardown (gyre_hpc.live.lost.SrunTeardown): event lost_rank_saved, exit 69;
                             the script, not signalled, sruns the step again in the same allocation, at most
                             run.max_relaunches times (gyre_hpc.slurm.relaunch, the rule of gyre train's
                             supervisor); the ranks resume. Lost while rank 0 started (no event of the step,
                             srun >= 128): srun again from what the step started from; after the relaunches the
                             job exits 69 (event rank_lost, at_start)
    exit 75 (preempted)      the ranks saved RUN_DIR/resume: `scontrol requeue` the job (slurm.requeue, at most
                             slurm.max_requeues times); the same job id gives the same RUN_DIR, so it resumes

Invariants
- Pure: the same (config, config path, overrides) give the same text; no clock, no environment, no files read.
- The layout is validated with ``layout.plan`` before anything is rendered: a layout that does not fit raises
  ``LayoutError`` naming the key to change, and no script is produced.
- The srun flags are ``Layout.control_srun_args()`` with the node list computed at run time, so the script and
  the ranks' own placement check agree.
- Open MPI loopback settings appear only when ``slurm.local_cluster`` is true.
- The bind shim's lines (``gyre_hpc.launcher.listen.batch_lines``) appear only when ``cluster.listen_interface`` names an
  interface, or is null with ``slurm.local_cluster`` true (then ``lo``).
- The script requeues itself only when ``slurm.requeue`` is true and ``slurm.max_requeues`` > 0, only on the
  preempted exit status (``gyre_hpc.lifecycle.recovery.PREEMPTED_EXIT``) or a resume state the step wrote, never after a
  SIGTERM to the batch shell (a plain ``scancel``; unless TERM is the preemption signal), and exits with the
  step's status otherwise.
- The script sruns the step again (same allocation) only when ``python -m gyre_hpc.slurm.relaunch`` says so:
  never after a signal to the batch shell, at most ``run.max_relaunches`` times (the helper counts them); its
  answer 69 (a rank lost while the step started, no relaunch left) makes the job's status 69.
- Every trap of the batch shell writes RUN_DIR/preempt.request whole (a temporary file, then ``mv``) before its
  ``kill`` forwards the signal to the step; a request left by an earlier step or job is removed before each srun
  unless this shell was signalled (tests/unit/test_sbatch_request.py).
- The checked-in scripts in sbatch/ equal ``render_sbatch`` of their configs (``python -m gyre_hpc.slurm.sbatch
  --write`` regenerates them; tests/unit/test_sbatch.py checks).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Sequence

from gyre_hpc.launcher import listen
from gyre_hpc.config import GyreConfig
from gyre_hpc.lifecycle.recovery import PREEMPTED_EXIT, RANK_LOST_EXIT, REQUEST_FILE, SBATCH_ENV, STEP_START
from gyre_hpc.launcher.openmpi import LOCAL_EXPORTS
from gyre_hpc.slurm.layout import local_nodes, plan
from gyre_hpc.launcher.slurm_options import parse_signal

#: checked-in script -> the config it is rendered from (paths relative to the repository root)
SCRIPTS = {
    "sbatch/gyre_2p4t.sh": "configs/gyre_2p4t.yaml",
    "sbatch/gyre_122b.sh": "configs/gyre_122b.yaml",
    "sbatch/local_4node.sh": "configs/local_4node.yaml",
}

def node_count(cfg: GyreConfig) -> int:
    """Nodes the job asks for: every cell's nodes; the allocator shares the first node."""
    return cfg.cluster.cells * cfg.cluster.nodes_per_cell


def render_sbatch(cfg: GyreConfig, config_path: str, overrides: Sequence[str] = ()) -> str:
    """The sbatch script that runs ``gyre train config_path`` (with ``--set`` overrides) for ``cfg``."""
    layout = plan(cfg.cluster, local_nodes(cfg.cluster))  # LayoutError before anything is rendered
    return "\n".join(_header(cfg) + _directives(cfg) + _environment(cfg) + _launch(cfg, layout, config_path,
                                                                                     overrides)) + "\n"


def _header(cfg: GyreConfig) -> list[str]:
    c = cfg.cluster
    gpus = f", {c.gpus_per_node} GPUs each" if c.gpus_per_node else ", CPU only"
    return [
        "#!/bin/bash",
        f"# gyre_hpc training job: {c.cells} cells x {c.nodes_per_cell} node(s) = {node_count(cfg)} nodes{gpus}.",
        "# Rendered from the config by gyre_hpc.slurm.sbatch (gyre submit CONFIG --dry-run); edit the config's",
        "# slurm section and re-render rather than editing this file. Adapting it: docs/slurm.md.",
        "#",
        "# Rank 0 (the allocator, CPU only) shares the first node with cell 0; every GPU runs one worker, and",
        "# each cell's worker 0 leads it. All ranks form one MPI world over PMIx: no Ray, no head node.",
    ]


def _directives(cfg: GyreConfig) -> list[str]:
    s, c = cfg.slurm, cfg.cluster
    sig, seconds = parse_signal(s.signal)
    out = ["", "# --- resources: every node of every cell, one task per node (the allocator overlaps node 1)",
           f"#SBATCH --job-name={s.job_name}", f"#SBATCH --nodes={node_count(cfg)}", "#SBATCH --ntasks-per-node=1",
           f"#SBATCH --cpus-per-task={s.cpus_per_task}"]
    if c.gpus_per_node:
        out.append(f"#SBATCH --gpus-per-node={c.gpus_per_node}")
    if s.mem is not None:
        out.append(f"#SBATCH --mem={s.mem}")
    out += ["# --- where: partition and account (absent = the cluster's defaults)"] if (s.partition or s.account) else []
    out += [f"#SBATCH --partition={s.partition}"] if s.partition else []
    out += [f"#SBATCH --account={s.account}"] if s.account else []
    out += ["# --- time limit; SIG" + sig + f" reaches this shell {seconds} s before it, and is forwarded to the step",
            f"#SBATCH --time={s.time}", f"#SBATCH --signal=B:{sig}@{seconds}",
            "#SBATCH --requeue" if s.requeue else "#SBATCH --no-requeue",
            "# --- logs (%x job name, %j job id); the directory must exist when the job starts"
            + ("; a requeued job appends" if s.requeue else "")]
    out += ["#SBATCH --open-mode=append"] if s.requeue else []
    out += [
            f"#SBATCH --output={s.output}", f"#SBATCH --error={s.error}"]
    if s.extra:
        out += ["# --- site options (slurm.extra)"] + [f"#SBATCH {e}" for e in s.extra]
    return out


def _environment(cfg: GyreConfig) -> list[str]:
    s = cfg.slurm
    out = ["", "set -euo pipefail", 'cd "$SLURM_SUBMIT_DIR"']
    if s.setup:
        out += ["", "# --- site setup (slurm.setup)"] + list(s.setup)
    exports = (LOCAL_EXPORTS if s.local_cluster else ()) + s.exports
    if s.local_cluster:
        out += ["", "# --- local emulated cluster only: Open MPI over TCP on loopback (slurm.local_cluster)"]
    elif exports:
        out += ["", "# --- environment (slurm.exports)"]
    out += [f"export {k}={shlex.quote(v)}" for k, v in (e.split("=", 1) for e in exports)]
    shim = listen.batch_lines(listen.interface(cfg.cluster.listen_interface, s.local_cluster), shlex.quote(s.python))
    return out + ([""] + shim if shim else [])


def _launch(cfg: GyreConfig, layout, config_path: str, overrides: Sequence[str]) -> list[str]:
    c, s = cfg.cluster, cfg.slurm
    sig, _ = parse_signal(s.signal)
    run_dir = f"{cfg.run.out_dir}/{cfg.run.name}-$SLURM_JOB_ID"
    srun = [a if not a.startswith("--nodelist=") else '--nodelist="$RANK_NODES"' for a in layout.control_srun_args()]
    train = [shlex.quote(s.python), "-m", "gyre_hpc.cli", "train", shlex.quote(config_path), "--run-dir",
             '"$RUN_DIR"'] + [a for o in overrides for a in ("--set", shlex.quote(o))] + ['"$@"']
    return [
        "", "# --- run directory: gyre submit sets GYRE_RUN_DIR; a plain sbatch uses run.out_dir/run.name-JOBID",
        f'RUN_DIR="${{GYRE_RUN_DIR:-{run_dir}}}"', 'mkdir -p "$RUN_DIR"',
        "", f"# --- placement (gyre_hpc.slurm.layout): {c.cells} cells of {c.nodes_per_cell} node(s), in SLURM's "
            "node order;", f"# rank 0 (the allocator) on the first node, then {c.workers} worker(s) per node, one per "
            "GPU: cell k's workers", f"# are ranks 1 + k x {c.workers_per_cell} .. and its worker 0 leads it",
        'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        f"if (( ${{#NODES[@]}} != {node_count(cfg)} )); then",
        f'  echo "gyre: the job has ${{#NODES[@]}} nodes, the layout needs {node_count(cfg)}" >&2; exit 2', "fi",
        'RANK_NODES="${NODES[0]}"',
        f'for N in "${{NODES[@]}}"; do for ((w = 0; w < {c.workers}; w++)); do RANK_NODES+=",$N"; done; done',
        "", "# --- this shell is the ranks' launcher: a signal to it is a preemption (or a cancel), written to",
        f"#     $RUN_DIR/{REQUEST_FILE} BEFORE it is forwarded to the step; rank 0 takes a SIGTERM that comes without",
        "#     it for srun's teardown after a lost rank (gyre_hpc.live.lost.SrunTeardown)",
        f"export {SBATCH_ENV}=1",
        "STEP=''; CANCELLED=0; SIGNALLED=0; RELAUNCHES=0",
        f'preempt_request() {{ {{ echo "SIG$1" > "$RUN_DIR/{REQUEST_FILE}.tmp" && mv -f "$RUN_DIR/{REQUEST_FILE}.tmp" '
        f'"$RUN_DIR/{REQUEST_FILE}"; }} 2>/dev/null || true; }}',
        f"trap 'SIGNALLED=1; preempt_request {sig}; kill -s {sig} $STEP 2>/dev/null || true' {sig}",
    ] + ([
        "# SIGTERM to this shell: scancel JOBID (a cancel), or SLURM preempting/requeueing the job itself",
        "trap 'CANCELLED=1; SIGNALLED=1; preempt_request TERM; kill -s TERM $STEP 2>/dev/null || true' TERM"]
        if sig != "TERM" else []) + [
        "while true; do",
        f"# --- one srun: the allocator + {c.cells} cells x {c.workers_per_cell} workers = "
        f"{1 + c.cells * c.workers_per_cell} ranks as one pmix world; a rank that dies ends the step",
        "#     (--kill-on-bad-exit) so a failure ends the job instead of hanging it; a request of an earlier step",
        "#     or job was served (one that came before this srun is kept: the ranks see it at start)",
        f'(( SIGNALLED )) || rm -f "$RUN_DIR/{REQUEST_FILE}"',
        f'touch "$RUN_DIR/{STEP_START}"',
        "srun " + " ".join(srun) + " \\", "  " + " ".join(train) + " &",
        "STEP=$!",
        "# wait returns early when a trapped signal arrives: keep waiting until the step has ended",
        'while kill -0 "$STEP" 2>/dev/null; do wait "$STEP" || true; done',
        'RC=0; wait "$STEP" || RC=$?',
    ] + _relaunch(cfg) + ["done"] + _requeue(s, config_path) + ['exit "$RC"']


def _relaunch(cfg: GyreConfig) -> list[str]:
    """Shell lines at the end of the step loop: a step that lost a rank (no signal to this shell, rank 0's
    ``lost_rank_saved`` during it) is run again in this allocation, at most run.max_relaunches times
    (gyre_hpc.slurm.relaunch, the rule of ``gyre train``'s own supervisor, gyre_hpc.live.supervise)."""
    n = cfg.run.max_relaunches
    ask = (f'{shlex.quote(cfg.slurm.python)} -m gyre_hpc.slurm.relaunch --run-dir "$RUN_DIR" --exit "$RC" '
           f'--done "$RELAUNCHES" --max {n} --events {shlex.quote(cfg.allocator.events_file)}')
    return [
        "# --- a rank lost (rank 0 saved its state after srun's teardown: event lost_rank_saved; or the step was",
        f"#     torn down while rank 0 started): srun again in this allocation, at most {n} times",
        "#     (run.max_relaunches); the ranks resume from RUN_DIR (gyre_hpc.slurm.relaunch). Its answer 69: a",
        "#     rank lost while the step started, relaunches spent: the job fails with 69 (event rank_lost)",
        "if (( RC != 0 && ! SIGNALLED )); then",
        f"  ASKED=0; {ask} || ASKED=$?",
        "  if (( ASKED == 0 )); then",
        "    RELAUNCHES=$(( RELAUNCHES + 1 ))",
        "    if (( ! SIGNALLED )); then continue; fi",
        f"  elif (( ASKED == {RANK_LOST_EXIT} )); then RC={RANK_LOST_EXIT}; fi",
        "fi",
        "break",
    ]


def _requeue(s, config_path: str) -> list[str]:
    """Shell lines: on the preempted status, requeue this job (same job id, same RUN_DIR: it resumes)."""
    by_hand = (f'  echo "gyre: preempted; the resume state is in $RUN_DIR: continue with '
               f'gyre train {shlex.quote(config_path)} --resume $RUN_DIR" >&2')
    if not (s.requeue and s.max_requeues):
        return ["", f"# --- preempted (exit {PREEMPTED_EXIT}): slurm.requeue is off; continue by hand",
                f"if (( RC == {PREEMPTED_EXIT} )); then", by_hand, "fi"]
    n = s.max_requeues
    return [
        "", f"# --- preempted (exit {PREEMPTED_EXIT}: checkpoint and resume state in $RUN_DIR): requeue this job, at "
            f"most {n} times;", "#     the same job id gives the same RUN_DIR, and the requeued ranks resume from it",
        "#     (srun may report 143 when --kill-on-bad-exit ended a rank that was exiting 75 itself: the resume",
        "#     state this step wrote is the proof); never after a SIGTERM to this shell (CANCELLED): a cancel",
        "#     stays cancelled, and what SLURM preempts or requeues itself it requeues itself",
        f'if (( RC == {PREEMPTED_EXIT} )) || [[ "$RUN_DIR/resume/state.json" -nt "$RUN_DIR/{STEP_START}" ]]; then',
        f'  if (( ! CANCELLED && ${{SLURM_RESTART_COUNT:-0}} < {n} )) && scontrol requeue "$SLURM_JOB_ID"; then',
        f'    echo "gyre: preempted; job $SLURM_JOB_ID requeued (restart $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) of '
        f'{n})" >&2',
        "    exit 0", "  fi", by_hand, "fi",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gyre_hpc.slurm.sbatch --write``: regenerate the checked-in scripts of ``SCRIPTS``."""
    from gyre_hpc.config import load_config
    from gyre_hpc.files.io import atomic_write_text

    p = argparse.ArgumentParser(prog="python -m gyre_hpc.slurm.sbatch", description=main.__doc__)
    p.add_argument("--write", action="store_true", help="write the scripts (default: list them)")
    p.add_argument("--root", default=".", help="repository root")
    args = p.parse_args(argv)
    for script, config in SCRIPTS.items():
        if args.write:
            root = Path(args.root)
            atomic_write_text(root / script, render_sbatch(load_config(root / config), config))
        print(f"{script} <- {config}", file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
