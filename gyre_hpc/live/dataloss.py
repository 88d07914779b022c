"""Lost training data of a live run: groups whose TITO could not be built or failed the integrity check.

The harness thread (``Rollouts``) appends one record per completed group to ``rollouts.groups``, with ``lost``
set to the reason when the group trains nothing because of its data (``trajectory.integrity``: records missing,
cut or inconsistent with what the proxy served; or a file that cannot be read or packed). The allocator thread
polls them here::

    poll()  ──▶ one event ``group_lost {gid, runs, reason}`` per newly lost group (in the run's event log)
            ──▶ lost > allocator.max_lost_group_share × max(planned groups, completed groups)?
                  yes: event ``error {error}``, and the run stops (LiveServer: reason "error: data loss ...")

Planned groups = ``allocator.steps × scheduler.batch_groups``: the share is of the run's training data, so one
lost group in the first batch does not stop a run that tolerates a few percent.

Invariants (tests/unit/test_data_loss.py)
- Each lost group is logged exactly once, in completion order; groups restored from an earlier segment are
  counted in the share but not logged again.
- ``over_share`` is true exactly when lost > max_share × max(planned, completed); max_share = 0 stops at the first.
- ``summary`` counts every lost group and, in ``runs_lost``, its runs that would have trained (an aborted run
  trains nothing anyway, and the proxy already counts the runs whose calls it lost: they end aborted).
"""
from __future__ import annotations

from typing import Callable

from gyre_hpc.lifecycle.recovery import DATA_LOSS


def over_share(lost: int, completed: int, planned: int, max_share: float) -> bool:
    return lost > max_share * max(planned, completed)


class LostGroups:
    def __init__(self, groups: Callable[[], list[dict]], max_share: float, planned: int):
        self.groups, self.max_share, self.planned = groups, max_share, planned
        self.seen = len(groups())  # restored from an earlier segment: logged there
        self.lost = sum(bool(g.get("lost")) for g in groups())
        self.error: str | None = None

    def poll(self, write: Callable[[dict], None]) -> str | None:
        """Log the groups lost since the last poll; returns the error once the share is exceeded."""
        groups = self.groups()
        if len(groups) == self.seen:
            return self.error
        new, self.seen = groups[self.seen:], len(groups)
        for g in new:
            if g.get("lost"):
                self.lost += 1
                write({"event": "group_lost", "gid": g["gid"], "runs": g["runs"], "reason": g["lost"]})
        lost = self.lost
        if self.error is None and over_share(lost, len(groups), self.planned, self.max_share):
            self.error = (f"{DATA_LOSS}: {lost} of {len(groups)} groups lost (more than "
                          f"allocator.max_lost_group_share={self.max_share:g} of max({self.planned} planned, "
                          f"{len(groups)} completed)); the first: group {_first(groups)}")
            write({"event": "error", "error": self.error})
        return self.error


def _first(groups: list[dict]) -> str:
    g = next(g for g in groups if g.get("lost"))
    return f"{g['gid']}: {str(g['lost']).splitlines()[0][:300]}"


def summary(groups: list[dict]) -> dict:
    """``groups_lost``, ``lost_groups`` (gid, runs, reason) and the runs that did not train because of it."""
    lost = [g for g in groups if g.get("lost")]
    return {"groups_lost": len(lost),
            "runs_lost_in_groups": sum(sum(s != "aborted" for s in g.get("statuses", [])) for g in lost),
            "lost_groups": [{"gid": g["gid"], "runs": g["runs"], "reason": g["lost"]} for g in lost]}
