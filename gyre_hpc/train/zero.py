"""The distributed optimizer (ZeRO stage 1, ``train.distributed_optimizer``): the AdamW moments of a data-parallel
training world are sharded over its replicas, one owner per parameter, instead of every replica holding all of them.

A step: every replica has the whole (all-reduced) gradient, as without sharding; each replica drops the gradients
of the parameters it does not own, AdamW updates only its own (it skips a parameter without a gradient and keeps no
state for it), then each parameter is broadcast from its owner to the other replicas.

Invariants
- ``owners`` is a pure function of the parameters' sizes and the replica count: every replica computes the same
  owner for every parameter (largest first onto the least-loaded replica; ties to the lower replica index), so each
  replica holds about 1/DP of the moments' elements.
- The weights after a sharded step equal the weights after an unsharded one bit for bit on every replica: the owner
  runs the same AdamW on the same gradient, and the broadcast copies its result.
- ``keep_owned`` leaves a replica with its own moments only; a checkpoint written under sharding holds each moment
  once, in its owner's rank file (``checkpoint.load_resharded`` gathers them from every replica for another layout).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist


def owners(numels: Sequence[int], replicas: int) -> list[int]:
    """The data-parallel replica that owns each parameter (index-aligned with ``numels``)."""
    load = [0] * replicas
    out = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        r = min(range(replicas), key=lambda r: (load[r], r))
        out[i] = r
        load[r] += numels[i]
    return out


class ShardedOptimizer:
    """Wraps the trainer's optimizer for one data-parallel replica of ``replicas`` in ``group``."""

    def __init__(self, optimizer, params: Sequence[torch.Tensor], replica: int, replicas: int, group) -> None:
        self.optimizer, self.params = optimizer, list(params)
        self.replica, self.group = replica, group
        self.owner = owners([p.numel() for p in self.params], replicas)
        self._src = [dist.get_global_rank(group, r) for r in range(replicas)]

    def step(self) -> None:
        """AdamW on this replica's parameters, then every parameter from its owner."""
        for p, owner in zip(self.params, self.owner):
            if owner != self.replica:
                p.grad = None
        self.optimizer.step()
        with torch.no_grad():
            for p, owner in zip(self.params, self.owner):
                dist.broadcast(p.data, src=self._src[owner], group=self.group)

    def keep_owned(self) -> None:
        """Drop the moments of the parameters another replica owns (after loading a whole optimizer state)."""
        self.optimizer.state = {i: s for i, s in self.optimizer.state.items() if self.owner[i] == self.replica}

    def held(self) -> tuple[int, int]:
        """(moment elements this replica holds, elements of every parameter): about 1/DP of the second."""
        mine = sum(self.params[i].numel() for i in self.optimizer.state)
        return mine, sum(p.numel() for p in self.params)
