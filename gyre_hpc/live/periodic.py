"""Rank 0's periodic resume state (edge: files): a run whose rank 0 dies can still be relaunched.

A preemption and a lost cell's rank save ``RUN_DIR/resume`` because rank 0 is alive to do it (live/preempt.py,
live/lost.py). When rank 0 itself dies (SIGKILL, the OOM killer, a segfault) nothing runs to save, so rank 0 saves
ahead of time, every ``run.resume_every_steps`` steps, at the one quiet point of its loop::

    the core's STEPPED(v) reaches the hub (Hub.poll → root.on_step): the allocator applies it, the step is recorded,
    ``lost.hold`` keeps hard links of the core's checkpoint of version v (checkpoints/applied)
      no group is out (the hub hands the next version's batch only after this), the core cannot step again
      ``due``?  snapshot under the harness's lock (Rollouts.lock: a group is in flight, held for its fixed batch
                 or offered to the hub, never between): the buffer with each group's ready_version, the queries in
                 flight (re-issued by the resume), the step records and counters of version v
                 ``lost.save``: RUN_DIR/resume replaced whole (temp dir + rename), the checkpoint of version v linked
                 event ``resume_saved {steps_done, version, save_ms, state_bytes}``; a failure is the event
                 ``resume_save_failed {steps_done, error}`` and the run goes on

A preemption or a lost rank later in the segment writes a newer state over it, as before. The supervisor
(live/supervise.py, slurm/relaunch.py) relaunches a segment that died without a summary when it logged
``resume_saved`` newer than the state it started from. The resumed run starts from version v: the steps the dead
segment trained after v are trained again, and the queries it admitted after the snapshot are admitted again
(their TITO files are moved to tito/interrupted/ first: ``rollouts.set_aside_from``).

Invariants (tests/unit/test_periodic_resume.py)
- ``due`` is a pure function of (steps done, ``resume_every_steps``, ``allocator.steps``): every
  ``resume_every_steps``-th step, never at the run's last step (the run is finishing: a state of every step done
  could not be resumed, the previous one can) and never when the setting is 0.
- A saved state passes ``gyre_hpc.lifecycle.resume.load`` (its checkpoint holds its version; counters agree with the step
  records) and names each group of the hub's buffer once and each query in flight once; a failed save leaves the
  previous state as it was and raises nothing.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from gyre_hpc.errors import GyreError
from gyre_hpc.lifecycle import resume
from gyre_hpc.lifecycle.recovery import RESUME_SAVED
from gyre_hpc.live import lost, preempt

EVENT = RESUME_SAVED
FAILED = "resume_save_failed"


def due(steps_done: int, every: int, total: int) -> bool:
    """Save after the step that made ``steps_done`` (``every``: run.resume_every_steps; ``total``: allocator.steps)?"""
    return every > 0 and 0 < steps_done < total and steps_done % every == 0


def snapshot(server, hub, rollouts, steps: list[dict], carry: dict, wall_s: float) -> dict:
    """The resume state of the run going on (``preempt.snapshot``, taken while no group changes place)."""
    with rollouts.lock:
        state = preempt.snapshot(server, hub, rollouts, steps, carry, wall_s)
        c = state["counters"]
        state["counters"] = {**c, "groups": list(c["groups"]), "build_errors": list(c["build_errors"])}
    state["steps"] = list(steps)
    return lost.caught_up(state, hub.version, steps)


def save(run_dir: Path, server, hub, rollouts, steps: list[dict], carry: dict, wall_s: float,
         write: Callable[[dict], object]) -> dict:
    """Write RUN_DIR/resume for the step just applied; ``write`` logs the event, which is returned."""
    t0 = server.clock.now()
    try:
        state = snapshot(server, hub, rollouts, steps, carry, wall_s)
        path = lost.save(run_dir, state)
        size = (path / resume.STATE).stat().st_size
    except (GyreError, OSError, ValueError, TypeError) as exc:  # never fatal: the run goes on without it
        rec = {"event": FAILED, "steps_done": len(steps), "error": f"{type(exc).__name__}: {exc}"[:500]}
    else:
        rec = {"event": EVENT, "steps_done": state["sched"]["steps_done"], "version": state["version"],
               "buffer": len(state["buffer"]), "inflight": len(state["inflight"]),
               "save_ms": round(1e3 * (server.clock.now() - t0), 3), "state_bytes": size}
    write(rec)
    return rec
