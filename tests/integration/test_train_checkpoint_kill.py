"""A process killed (SIGKILL) in the middle of a checkpoint save leaves the previous checkpoint whole."""
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

CHILD = textwrap.dedent("""
    import os, signal, sys
    import torch
    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train import checkpoint
    from gyre_hpc.train.step import Trainer

    path = sys.argv[1]
    trainer = Trainer(ModelConfig(), TrainConfig(), seed=0)
    trainer.save_checkpoint(path)                 # version 0, complete
    trainer.version = 7
    real_save = torch.save

    def save_then_die(obj, f, *a, **k):          # the new rank file is written, the rename never happens
        real_save(obj, f, *a, **k)
        os.kill(os.getpid(), signal.SIGKILL)

    checkpoint.torch.save = save_then_die
    trainer.save_checkpoint(path)
    print("not reached")
""")


def test_sigkill_during_save_leaves_the_previous_checkpoint(tmp_path):
    from gyre_hpc.train import checkpoint

    path = tmp_path / "ckpt"
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert "not reached" not in out.stdout
    state, meta = checkpoint.load(path)
    assert meta["version"] == 0 and state["version"] == 0
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name != "ckpt")
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-ckpt-")  # the abandoned temporary directory
