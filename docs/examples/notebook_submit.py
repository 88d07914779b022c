"""Submit a short live training run from Python (a notebook cell per block) and follow it.

    scripts/local-slurm.sh start          # or run on a SLURM login node; without SLURM the local executor is used
    python docs/examples/notebook_submit.py
"""
import time

import gyre_hpc

# --- submit: the config is checked here; a typo in a key fails now, before anything is queued
run = gyre_hpc.submit("configs/local_4node.yaml", cluster__cells=3, allocator__steps=2,
                      overrides={"scheduler.policy": "colocate", "scheduler.batch_groups": 2,
                                 "proxy.startup_timeout_s": 180})
print(run)

# --- follow: state and the newest events while it runs
while not run.done():
    print(run.state, "|", (run.tail(1) or "(no events yet)").strip())
    time.sleep(10)

# --- the summary (RUN_DIR/summary.json); a failed job raises JobError with its error tail
summary = run.result()
print({k: summary[k] for k in ("policy", "steps", "wall_s", "reward_first", "reward_last", "staleness_mean")})
print("run directory:", run.run_dir)
