"""How a request moves from a leaving engine to another: the ``Mover`` seam and its re-prefill implementation.

The proxy moves a request in four steps; only step 3 is the mover's::

    1. abort it on the source engine        /abort_request {rid}  → 200, partial output_ids (none if it died)
    2. choose the target engine             routing.Router.start
    3. mover.prepare(plan)                  make the target ready to continue from plan.tokens
    4. resubmit the continuation            /generate {input_ids: prompt + partial, max_new_tokens: rest}

The seam's types (``MovePlan``, ``MoveCost``, ``Mover``) are ``gyre_hpc.proxy.moveplan``'s, which both movers
import. ``ReprefillMover`` does nothing in step 3: the target recomputes the whole prefix (prompt + partial) when the
continuation arrives, which is the only way SGLang 0.5.23 offers (it has no API to migrate a running request's
KV cache). Its cost is ``reprefill_tokens = len(plan.tokens)`` of prefill on the target.

The Mooncake KV-block mover is ``gyre_hpc.proxy.kvmover.KVMover`` (``proxy.mover: kv``, the default); as designed: a ``KVBlockMover`` implements ``prepare`` by asking the
source engine for the KV blocks of ``plan.tokens`` (after the abort they are still in its prefix cache), writing
them into the target's prefix cache over Mooncake Transfer Engine (``gyre_hpc.transfer``, RDMA on a cluster), and
returning ``MoveCost(reprefill_tokens=<tokens not covered>, moved_tokens=<tokens covered>, seconds=...)``. The
continuation request stays byte-identical, so the target's prefix cache turns it into a cache hit. It must fall
back to re-prefill (return ``reprefill_tokens=len(plan.tokens)``) when ``plan.source_alive`` is false or the
transfer fails; a move never fails because of the mover. Select it with ``proxy.mover`` and ``make_mover``.

Invariant: ``prepare`` never changes what the target generates; it only changes how much the target recomputes
(``reprefill_tokens + moved_tokens == len(plan.tokens)``).
"""
from __future__ import annotations

from gyre_hpc.proxy.moveplan import MoveCost, MovePlan, Mover
from gyre_hpc.proxy.routing import ProxyError

MOVERS = ("kv", "reprefill")


class ReprefillMover:
    """Nothing to move: the target re-prefills prompt + partial output."""

    name = "reprefill"

    async def prepare(self, plan: MovePlan) -> MoveCost:
        return MoveCost(reprefill_tokens=len(plan.tokens), moved_tokens=0, seconds=0.0)


def make_mover(kind: str, events=None, version_policy: str = "reprefill", clock=None) -> Mover:
    """``kv``: ``gyre_hpc.proxy.kvmover.KVMover`` (falls back to re-prefill per move); ``reprefill``: always."""
    if kind == "reprefill":
        return ReprefillMover()
    if kind == "kv":
        from gyre_hpc.proxy.events import proxy_log
        from gyre_hpc.proxy.kvmover import KVMover

        return KVMover(events if events is not None else proxy_log(None), version_policy, clock=clock)
    raise ProxyError(f"proxy.mover: {kind!r} is not one of {', '.join(MOVERS)}")
