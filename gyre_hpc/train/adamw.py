"""AdamW as torch computes it, without ``torch.optim.Optimizer``: torch's functional ``torch.optim.adamw.adamw``
(the function ``torch.optim.AdamW.step`` calls) over per-parameter state held here.

Why not ``torch.optim.AdamW`` itself: every method of ``torch.optim.Optimizer`` (``add_param_group`` in the
constructor, ``zero_grad``, ``step``, ``state_dict``, ``load_state_dict``) imports torch._dynamo the first time it
runs (``torch._disable_dynamo``), about 1.4 CPU s in each process that trains (every cell rank of a live run) for a
compiler that is never used (benchmarks/results/test_cpu.md). The functional form imports nothing more.

Invariants
- ``step()`` makes the update ``torch.optim.AdamW(params, lr, betas, eps, weight_decay)`` makes from the same
  state, bit for bit (same function, same arguments: no amsgrad, no maximize, torch's default foreach/fused choice);
  parameters whose ``.grad`` is None are skipped and their state is left as it is, as torch does.
- ``state_dict()`` has ``torch.optim.AdamW``'s format (``state`` keyed by the parameter's index, ``step`` a float32
  CPU tensor; one param group listing every index), so checkpoints load in either; ``load_state_dict`` accepts
  both and refuses a state for a different number of parameters with ``ValueError``.
- No import of torch._dynamo (tests/integration/test_megatron_import.py).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.optim.adamw import adamw


class AdamW:
    """AdamW over ``params`` (one group), with the interface the trainers use: ``step``, ``zero_grad``,
    ``state_dict``, ``load_state_dict``."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), (float(betas[0]), float(betas[1])), eps, weight_decay
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        live = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
        for i, p in live:
            if i not in self.state:
                self.state[i] = {"step": torch.tensor(0.0, dtype=torch.float32),
                                 "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                 "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        if not live:
            return
        states = [self.state[i] for i, _ in live]
        adamw([p for _, p in live], [p.grad for _, p in live], [s["exp_avg"] for s in states],
              [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states],
              has_complex=any(torch.is_complex(p) for _, p in live), amsgrad=False, beta1=self.betas[0],
              beta2=self.betas[1], lr=self.lr, weight_decay=self.weight_decay, eps=self.eps, maximize=False)

    # --------------------------------------------------------------------------------------------- state
    def _group(self) -> dict[str, Any]:
        return {"lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay,
                "amsgrad": False, "foreach": None, "maximize": False, "capturable": False, "differentiable": False,
                "fused": None, "decoupled_weight_decay": True, "params": list(range(len(self.params)))}

    def state_dict(self) -> dict[str, Any]:
        return {"state": {i: dict(s) for i, s in sorted(self.state.items())}, "param_groups": [self._group()]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        indices = [i for g in state_dict["param_groups"] for i in g["params"]]
        if len(indices) != len(self.params):
            raise ValueError(f"optimizer state for {len(indices)} parameters, this model has {len(self.params)}")
        position = {index: k for k, index in enumerate(indices)}  # saved index -> this optimizer's parameter
        state = {}
        for index, saved in state_dict["state"].items():
            p = self.params[position[index]]
            state[position[index]] = {
                k: (v.detach().to(torch.float32).clone() if k == "step"
                    else v.detach().to(dtype=p.dtype, device=p.device).clone()) for k, v in saved.items()}
        self.state = state
