"""The training side of the simulator: ready groups, the streaming or fixed-batch trainer, optimizer steps.

A mixin of ``Simulation`` (it uses the simulation's state, event queue, pool and policy). Groups are trained
one at a time as a fluid: the current group's remaining work drains at the number of active training cells
(cell-seconds per second); the core applies the optimizer step after every B groups.

Invariants
- A streaming policy hands ready groups to the trainer in completion order; a fixed-batch policy hands
  over batch b (queries b*B .. b*B+B-1) only when all of its groups are ready, and batches in order.
- The trainer processes nothing while the core applies an optimizer step, while no training cell is
  active, or once the burst has its ``mu`` steps.
- Every trained token's lag is recorded once, at the version its group is trained with.
"""
from __future__ import annotations

from gyre_hpc.allocator import transitions as tr
from gyre_hpc.allocator.batches import batch_may_start, burst_open

PULL_DONE, TRAIN_DONE, OPT_DONE = 3, 4, 5


class TrainerSide:
    def _release(self, groups: list[int]) -> None:
        """Hand held ready groups of a complete fixed batch to the trainer, in admission order."""
        st = self.state
        for g in groups:
            self.tq.append(g)
            st.unprocessed_groups += 1
            st.backlog_work_s += self.g_work[g]

    def _release_batches(self, qi: int) -> None:
        """Fixed batches (non-streaming): batch b = queries b*B..b*B+B-1, released whole and in order."""
        for batch in self.batches.ready(qi, qi):  # the allocator's one former (allocator.batches)
            self._release(batch)

    def _tr_may_run(self) -> bool:
        st, mu = self.state, self.policy.mu
        return not st.optimizing and burst_open(mu, st.burst_steps) and bool(self.train_active)

    def _tr_advance(self, now: float) -> None:
        dt = now - self.tr_t
        self.tr_t = now
        if dt > 0 and self.cur >= 0 and self._tr_may_run():
            done = min(self.cur_left, dt * len(self.train_active))
            self.cur_left -= done
            self.train_busy += done
            self.state.backlog_work_s = max(0.0, self.state.backlog_work_s - done)

    def _tr_kick(self, now: float) -> None:
        """(Re)start processing if possible and schedule the current group's completion."""
        self._tr_advance(now)
        self.tr_stamp += 1
        if not self._tr_may_run():
            return
        if self.cur < 0 and self.tq:
            if batch_may_start(self.policy.streaming, self.step_n > 0, len(self.tq), self.B):
                self.cur = self.tq.popleft()
                self.cur_left = self.g_work[self.cur]
        if self.cur >= 0:
            self.q.push(now + self.cur_left / len(self.train_active), TRAIN_DONE, self.tr_stamp)

    def _on_train_done(self, now: float, stamp: int, _: int) -> None:
        if stamp != self.tr_stamp:
            return
        self._tr_advance(now)
        st, g = self.state, self.cur
        self.cur = -1
        tr.groups_trained(st, 1, 0.0)  # its work already left the backlog while it was processed
        self._record_lag(g, st.version)
        self.step_n += 1
        if self.step_n == self.B:
            st.optimizing = True
            self.tr_stamp += 1
            self.q.push(now + self.sim.optimizer_s, OPT_DONE)
        else:
            self._tr_kick(now)

    def _record_lag(self, g: int, version: int) -> None:
        for versions, tokens in self.g_trained.pop(g):
            if not versions:
                continue
            lag, tokens = self.ledger.add_run(version, versions, tokens)
            self.batch_lag[0] += lag * tokens
            self.batch_lag[1] += tokens

    def trained(self, r: int) -> tuple[list[int], list[float]]:
        """(versions, tokens) of run ``r``'s trained tokens: the last ``train_window`` of its work."""
        seg, window, rate = self.pool.segs[r], self.train_window[r], self.tok_rate[r]
        if window >= sum(seg.values()):
            return list(seg), [w * rate for w in seg.values()]
        versions, tokens = [], []
        for v in reversed(seg):
            take = min(seg[v], window)
            versions.append(v)
            tokens.append(take * rate)
            window -= take
            if window <= 0:
                break
        return versions, tokens

    def _on_opt_done(self, now: float, a: int, b: int) -> None:
        st = self.state
        self.train_busy += self.sim.optimizer_s
        self.step_times.append(now)
        tr.step_done(st, self.B, self.batch_lag[0] / self.batch_lag[1] if self.batch_lag[1] else 0.0, now,
                     self.batch_lag[1])
        self.batch_lag = [0.0, 0.0]
        self.step_n = 0
        self.pool.bump(now, st.version)
        self.tr_t = now
        for c in sorted(self.train_active - {st.core}):
            self.train_active.discard(c)
            self.q.push(now + self.pull_s, PULL_DONE, c)
        self._tr_kick(now)
