"""``gyre train`` installs its preemption handlers before anything heavy is imported (gyre_hpc/live/rank.py):
importing the job, the rank dispatch and the launcher loads neither torch, MPI, megatron nor Mooncake."""
import subprocess
import sys

HEAVY = ("torch", "mpi4py", "megatron", "mooncake", "submitit", "transformers")


def test_importing_gyre_train_and_the_live_rank_dispatch_loads_no_heavy_module():
    code = ("import sys, jobs.train, gyre_hpc.live.rank, gyre_hpc.live.launch; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
