#!/bin/bash
# gyre_hpc training job: 4 cells x 1 node(s) = 4 nodes, CPU only.
# Rendered from the config by gyre_hpc.slurm.sbatch (gyre submit CONFIG --dry-run); edit the config's
# slurm section and re-render rather than editing this file. Adapting it: docs/slurm.md.
#
# Rank 0 (the allocator, CPU only) shares the first node with cell 0; every GPU runs one worker, and
# each cell's worker 0 leads it. All ranks form one MPI world over PMIx: no Ray, no head node.

# --- resources: every node of every cell, one task per node (the allocator overlaps node 1)
#SBATCH --job-name=gyre_local
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
# --- time limit; SIGUSR1 reaches this shell 60 s before it, and is forwarded to the step
#SBATCH --time=00:15:00
#SBATCH --signal=B:USR1@60
#SBATCH --requeue
# --- logs (%x job name, %j job id); the directory must exist when the job starts; a requeued job appends
#SBATCH --open-mode=append
#SBATCH --output=runs/%x-%j.out
#SBATCH --error=runs/%x-%j.err

set -euo pipefail
cd "$SLURM_SUBMIT_DIR"

# --- local emulated cluster only: Open MPI over TCP on loopback (slurm.local_cluster)
export OMPI_MCA_btl=self,tcp
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1

# --- listeners of the step's tasks bind lo's address (cluster.listen_interface): an LD_PRELOAD shim
#     (gyre_hpc/native/bind_local.c) for what has no bind setting (Open MPI's TCP BTL, Mooncake); tasks only
export GYRE_LISTEN_INTERFACE=lo
GYRE_BIND_LOCAL="$(python3 -m gyre_hpc.live.bind_local || true)"
if [[ -n "$GYRE_BIND_LOCAL" ]]; then
  export SLURM_EXPORT_ENV="${SLURM_EXPORT_ENV:-ALL},LD_PRELOAD=$GYRE_BIND_LOCAL${LD_PRELOAD:+:$LD_PRELOAD}"
fi

# --- run directory: gyre submit sets GYRE_RUN_DIR; a plain sbatch uses run.out_dir/run.name-JOBID
RUN_DIR="${GYRE_RUN_DIR:-runs/local_4node-$SLURM_JOB_ID}"
mkdir -p "$RUN_DIR"

# --- placement (gyre_hpc.slurm.layout): 4 cells of 1 node(s), in SLURM's node order;
# rank 0 (the allocator) on the first node, then 1 worker(s) per node, one per GPU: cell k's workers
# are ranks 1 + k x 1 .. and its worker 0 leads it
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
if (( ${#NODES[@]} != 4 )); then
  echo "gyre: the job has ${#NODES[@]} nodes, the layout needs 4" >&2; exit 2
fi
RANK_NODES="${NODES[0]}"
for N in "${NODES[@]}"; do for ((w = 0; w < 1; w++)); do RANK_NODES+=",$N"; done; done

# --- this shell is the ranks' launcher: a signal to it is a preemption (or a cancel), written to
#     $RUN_DIR/preempt.request BEFORE it is forwarded to the step; rank 0 takes a SIGTERM that comes without
#     it for srun's teardown after a lost rank (gyre_hpc.live.lost.SrunTeardown)
export GYRE_SBATCH_LAUNCHED=1
STEP=''; CANCELLED=0; SIGNALLED=0; RELAUNCHES=0
preempt_request() { { echo "SIG$1" > "$RUN_DIR/preempt.request.tmp" && mv -f "$RUN_DIR/preempt.request.tmp" "$RUN_DIR/preempt.request"; } 2>/dev/null || true; }
trap 'SIGNALLED=1; preempt_request USR1; kill -s USR1 $STEP 2>/dev/null || true' USR1
# SIGTERM to this shell: scancel JOBID (a cancel), or SLURM preempting/requeueing the job itself
trap 'CANCELLED=1; SIGNALLED=1; preempt_request TERM; kill -s TERM $STEP 2>/dev/null || true' TERM
while true; do
# --- one srun: the allocator + 4 cells x 1 workers = 5 ranks as one pmix world; a rank that dies ends the step
#     (--kill-on-bad-exit) so a failure ends the job instead of hanging it; a request of an earlier step
#     or job was served (one that came before this srun is kept: the ranks see it at start)
(( SIGNALLED )) || rm -f "$RUN_DIR/preempt.request"
touch "$RUN_DIR/.step-start"
srun --ntasks=5 --distribution=arbitrary --nodelist="$RANK_NODES" --overlap --overcommit --mpi=pmix --kill-on-bad-exit=1 \
  python3 -m gyre_hpc.cli train configs/local_4node.yaml --run-dir "$RUN_DIR" "$@" &
STEP=$!
# wait returns early when a trapped signal arrives: keep waiting until the step has ended
while kill -0 "$STEP" 2>/dev/null; do wait "$STEP" || true; done
RC=0; wait "$STEP" || RC=$?
# --- a rank lost (rank 0 saved its state after srun's teardown: event lost_rank_saved; or the step was
#     torn down while rank 0 started): srun again in this allocation, at most 2 times
#     (run.max_relaunches); the ranks resume from RUN_DIR (gyre_hpc.slurm.relaunch). Its answer 69: a
#     rank lost while the step started, relaunches spent: the job fails with 69 (event rank_lost)
if (( RC != 0 && ! SIGNALLED )); then
  ASKED=0; python3 -m gyre_hpc.slurm.relaunch --run-dir "$RUN_DIR" --exit "$RC" --done "$RELAUNCHES" --max 2 --events events.jsonl || ASKED=$?
  if (( ASKED == 0 )); then
    RELAUNCHES=$(( RELAUNCHES + 1 ))
    if (( ! SIGNALLED )); then continue; fi
  elif (( ASKED == 69 )); then RC=69; fi
fi
break
done

# --- preempted (exit 75: checkpoint and resume state in $RUN_DIR): requeue this job, at most 3 times;
#     the same job id gives the same RUN_DIR, and the requeued ranks resume from it
#     (srun may report 143 when --kill-on-bad-exit ended a rank that was exiting 75 itself: the resume
#     state this step wrote is the proof); never after a SIGTERM to this shell (CANCELLED): a cancel
#     stays cancelled, and what SLURM preempts or requeues itself it requeues itself
if (( RC == 75 )) || [[ "$RUN_DIR/resume/state.json" -nt "$RUN_DIR/.step-start" ]]; then
  if (( ! CANCELLED && ${SLURM_RESTART_COUNT:-0} < 3 )) && scontrol requeue "$SLURM_JOB_ID"; then
    echo "gyre: preempted; job $SLURM_JOB_ID requeued (restart $(( ${SLURM_RESTART_COUNT:-0} + 1 )) of 3)" >&2
    exit 0
  fi
  echo "gyre: preempted; the resume state is in $RUN_DIR: continue with gyre train configs/local_4node.yaml --resume $RUN_DIR" >&2
fi
exit "$RC"
