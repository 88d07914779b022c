"""Building a megatron model and training it imports no torch._dynamo/_inductor, and torch.compile stays the real
one (gyre_hpc/train/lazy_compile.py: megatron-core's jit_fuser functions compile at their first call;
gyre_hpc/train/adamw.py: AdamW without torch.optim.Optimizer, whose methods import torch._dynamo)."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.megatron

PROBE = """
import json, sys, torch
real = torch.compile
from gyre_hpc.config import ModelConfig, TrainConfig
from gyre_hpc.train.step import Trainer
t = Trainer(ModelConfig(), TrainConfig())  # builds the model, then the optimizer
for p in t.params:
    p.grad = torch.ones_like(p)
t.clip_grads(); t.optimizer.step(); t.optimizer.zero_grad(); t.load_state_dict(t.state_dict())
from megatron.core import jit
from megatron.core.fusions import fused_bias_geglu
print(json.dumps({"real": torch.compile is real, "inductor": "torch._inductor.compile_fx" in sys.modules,
                  "dynamo": "torch._dynamo" in sys.modules, "fuser_deferred": jit.jit_fuser.func.__name__,
                  "geglu": fused_bias_geglu.geglu.__name__}))
"""


def test_a_process_that_builds_and_trains_a_megatron_model_never_imports_the_compiler_and_keeps_torch_compile():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"real": True, "inductor": False, "dynamo": False, "fuser_deferred": "compile_on_first_call",
                   "geglu": "geglu"}
