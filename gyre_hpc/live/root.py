"""Rank 0 of a live run (edge): the allocator server, the proxy, the harness and the data-plane hub.

::

    start the proxy (subprocess, its event log in the run dir) ─▶ broadcast its URL to the cells
    LiveServer.run():   each pass = AllocatorServer.step (messages → SchedState → the policy's orders)
                                    + Hub.poll (groups out to training cells, step records in)
                        Admit orders start groups in the harness (Rollouts); ready groups → hub + GroupsReady
    before the orderly shutdown: cut the runs still going, read the proxy's stats
    after it: stop the proxy, read the cells' stats, replay the run in the simulator (sim_wall_s),
              write summary.json and the report PNGs
    data loss (live.dataloss): each lost group is an event; above allocator.max_lost_group_share the run
               stops in order with reason "error: data loss ..." (summary "error"; gyre train exits 2)
    preempted (SIGTERM/SIGUSR1, live.preempt): no more groups or decisions; once no step is pending, the
               resume state goes to RUN_DIR/resume and the cells get Shutdown("preempted: SIG"); no summary
    resumed (RUN_DIR/resume exists): buffer, counters and step records come back before the first decision
    rank lost (mpirun's SIGTERM under ``gyre train``, live.lost): no orderly shutdown; the resume state of
               what rank 0 holds goes to RUN_DIR/resume (event ``lost_rank_saved``), then exit 69
    every run.resume_every_steps steps (live/periodic.py): RUN_DIR/resume at the step just applied (event
               ``resume_saved``), so a run whose rank 0 dies is relaunched from it

Invariants (tests/integration/test_live_training.py)
- Every decision comes from the same policy object the simulator drives (``make_policy``).
- A step is reported once, by the core's STEPPED on the data plane: ``LiveServer.apply_step`` applies it to the
  allocator's state in the pass the hub takes it, so the allocator's version always equals the hub's.
- Every optimizer step is in the event log (``train_step``: version, groups, staleness, reward) and in
  ``metrics.jsonl``; the summary is computed from those records and the cells' stats, never estimated.
  A resumed run's summary covers every segment (the saved step records and counters plus the new ones).
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import yaml

from gyre_hpc import resume
from gyre_hpc.allocator import batches
from gyre_hpc.allocator.eventlog import EventLog, read_events
from gyre_hpc.allocator.roles import role_share
from gyre_hpc.allocator.messages import TrainProgress
from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.server import AllocatorServer
from gyre_hpc.allocator.sim.replay import live_prediction
from gyre_hpc.allocator.types import Role
from gyre_hpc.config import GyreConfig, to_dict
from gyre_hpc.errors import ConfigError, GyreError
from gyre_hpc.files.io import atomic_write_json, atomic_write_text
from gyre_hpc.live import dataloss, lost, periodic, preempt
from gyre_hpc.live.hub import Hub
from gyre_hpc.live.rollouts import Rollouts
from gyre_hpc.tracking import live as tracking
from gyre_hpc.tracking.plan import flat_params
from gyre_hpc.train import agreement

PROGRESS_EVERY_S = 5.0


class LiveServer(AllocatorServer):
    """The allocator loop plus the hub's data plane in the same thread (the only thread that touches MPI)."""

    def __init__(self, *args, hub: Hub, before_shutdown=lambda reason: None, progress=lambda: None,
                 preemption: preempt.Preemption | None = None, teardown: lost.Teardown | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.hub, self.before_shutdown, self.progress = hub, before_shutdown, progress
        self.preemption = preemption or preempt.Preemption()
        self.teardown = teardown or lost.Teardown()
        self.last_progress = 0.0
        self.lost_groups: dataloss.LostGroups | None = None
        self.step_applied = False

    def stop_reason(self) -> str | None:
        if self.teardown.requested:  # a rank is gone: nothing else matters now
            return self.teardown.reason()
        reason = super().stop_reason()
        if reason is None and self.lost_groups is not None and self.lost_groups.error is not None:
            return f"error: {self.lost_groups.error}"
        if reason is None:
            self.preemption.poll()  # the launcher's request file (live.preempt.REQUEST_FILE)
        if reason is not None or not self.preemption.requested:
            return reason
        self.hub.freeze()  # the core can finish the step already out, and no other
        quiet = self.started and not self.hub.step_pending
        return f"preempted: {self.preemption.signal}" if quiet or self.preemption.overdue else None

    def _decide(self, now: float) -> None:
        if not self.preemption.requested:
            super()._decide(now)

    def step(self) -> bool:
        changed = super().step()
        if self.lost_groups is not None:
            self.lost_groups.poll(self.log.write)
        if self.clock.now() - self.last_progress > PROGRESS_EVERY_S:
            self.last_progress = self.clock.now()
            self.progress()
        busy = self.hub.poll()
        if self.step_applied:  # a step changes what the policy sees: decide in the pass that applied it
            self.step_applied = False
            if self.started and self.stop_reason() is None:
                self._decide(self.clock.now())
        return busy or changed

    def apply_step(self, rec: dict, progress: dict) -> None:
        """The core's STEPPED, which the hub just took, is the one report of an optimizer step: it reaches the
        allocator's state (as the core's ``TrainProgress`` to version ``rec["version"]``, with the groups it
        processed since its last report) before the hub answers another WANT, so both see the same version."""
        msg = TrainProgress(cell=self.state.core, version=rec["version"], groups=progress.get("groups", 0),
                            work_s=progress.get("work_s", 0.0), mean_lag=max(0.0, rec.get("staleness_mean", 0.0)),
                            lag_tokens=float(rec.get("lag_tokens", 0)))
        self.step_applied |= self._apply(msg, self.clock.now(), None)

    def abandon_shutdown(self) -> bool:
        return self.teardown.requested  # mpirun is ending every rank: no Bye will come

    def shutdown(self, reason: str) -> dict:
        self.before_shutdown(reason)
        if not reason.startswith(lost.REASON):
            return super().shutdown(reason)
        # the job is being torn down: no message to ranks that may be gone, no Byes to wait for
        summary = {"reason": reason, "steps_done": self.state.steps_done, "version": self.state.version,
                   "lost": self.ex.lost, "no_bye": []}
        self.log.write({"event": "stop", **summary})
        self.log.close()
        self.closed = True
        return summary


def run_root(cfg: GyreConfig, run_dir: Path, transport, comm,
             preemption: preempt.Preemption | None = None, teardown: lost.Teardown | None = None) -> dict:
    """Drive the live run from rank 0; returns the summary (also written to summary.json), or
    ``{"preempted": ...}`` when a preemption signal stopped it with its resume state saved, or
    ``{"rank_lost": ...}`` when mpirun tore the job down (``teardown``, live.lost)."""
    from gyre_hpc.engines.launch import on_free_port
    from gyre_hpc.proxy.client import ProxyClient
    from gyre_hpc.proxy.launch import start_proxy
    import dataclasses

    clock = transport.clock  # the rank's one clock: the event log's, the allocator's and the run's wall time
    t0 = clock.now()
    preemption = preemption or preempt.Preemption()
    saved = _load_resume(cfg, run_dir)
    pcfg = dataclasses.replace(cfg.proxy, event_log=str(run_dir / "proxy-events.jsonl"),
                               tito_dir=str(run_dir / "tito"))
    if pcfg.openai.tokenizer is None and cfg.model.hf_path is not None:  # the OpenAI endpoint's chat template
        pcfg = dataclasses.replace(pcfg, openai=dataclasses.replace(pcfg.openai, tokenizer=cfg.model.hf_path))
    steps: list[dict] = []
    end: dict = {}
    reissue = cfg.allocator.preempt_inflight == "reissue"
    carry: dict = preempt.inflight_counters(saved, reissue) if saved else {}
    proxy = None
    tracker = tracking.for_run(cfg.tracking, run_dir, saved, params=flat_params(to_dict(cfg)),  # rank 0's sink
                               hold_steps=cfg.run.resume_every_steps > 0, tags={"policy": cfg.scheduler.policy})
    try:
        proxy = on_free_port(start_proxy, pcfg, host=cfg.proxy.host, log_path=run_dir / "proxy.log",
                             config_dir=run_dir)  # a port taken before the proxy binds it: another port
        comm.bcast(proxy.url, root=0)
        policy = make_policy(cfg.scheduler.policy, cfg.scheduler, cfg.cluster.cells)
        log = EventLog(run_dir / cfg.allocator.events_file, transport.clock)
        tracking.tee(log, tracker)
        server: LiveServer | None = None

        def on_step(rec: dict) -> None:
            server.apply_step(rec, rec.pop("progress", {}))  # the step's one report reaches the allocator here
            steps.append(rec)
            lost.hold(run_dir, rec["version"])  # the checkpoint a lost rank's resume state uses
            server.log.write({"event": "train_step", **rec})
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
            if tracker is not None:
                tracker.step(rec, clock.now())
                if tracking.images_due(cfg.tracking, len(steps), cfg.allocator.steps):  # drawn on its own thread
                    snap, secs = list(steps), [g["seconds"] for g in rollouts.groups]
                    tracker.render(lambda: tracking.render_plots(run_dir, cfg.allocator.events_file,
                                                                 cfg.cluster.cells, snap, secs), rec["step"])
            if periodic.due(len(steps), cfg.run.resume_every_steps, cfg.allocator.steps):  # rank 0 may die later
                ev = periodic.save(run_dir, server, hub, rollouts, steps, carry, clock.now() - t0, server.log.write)
                if tracker is not None and ev.get("event") == "resume_saved":
                    tracker.kept(rec["step"])
            progress()

        def progress() -> None:
            st = server.state
            roles = {r.value: sum(c.role is r for c in st.cells) for r in Role}
            if tracker is not None:
                tracker.observe_roles(clock.now(), roles)
                tracking.flush_errors(tracker, server.log.write)
            last = steps[-1] if steps else {}
            reward = last.get("reward")
            print(f"[gyre {cfg.scheduler.policy}] step {st.steps_done}/{cfg.allocator.steps} "
                  f"cells rollout={roles['rollout']} train={roles['train']} "
                  f"switching={roles['draining'] + roles['loading']} lost={roles['lost']} | "
                  f"ready {st.ready_groups} inflight {st.inflight_groups} | "
                  f"staleness {last.get('staleness_mean', 0.0):.2f} = {last.get('staleness_prequeue_mean', 0.0):.2f}"
                  f" pre + {last.get('staleness_inqueue_mean', 0.0):.2f} queued (max {last.get('staleness_max', 0)}) | "
                  f"reward {'-' if reward is None else f'{reward:.3f}'} | {clock.now() - t0:.0f}s",
                  file=sys.stderr, flush=True)

        hub = Hub(comm, cfg.scheduler.batch_groups, policy.streaming, cfg.cluster.cells,
                  lambda c: server.state.cells[c].role, on_step,
                  burst_open=lambda: batches.burst_open(policy.mu, server.state.burst_steps),
                  on_event=lambda rec: server.log.write(rec))
        rollouts = Rollouts(run_dir, proxy.url, hub.offer, fixed_batches=not policy.streaming, clock=clock,
                            agent=cfg.agent, grader=cfg.grader, model=cfg.model, engine=cfg.engine,
                            trajectory=cfg.trajectory, seed=cfg.run.seed, cells=cfg.cluster.cells,
                            batch_groups=cfg.scheduler.batch_groups)
        preemption.on_signal = rollouts.close  # from the signal on, no group starts or joins the buffer
        if preemption.requested:
            rollouts.close()

        def before_shutdown(reason: str) -> None:
            if reason.startswith(lost.REASON):  # mpirun kills rank 0 KILL_AFTER_S from now: save first, only
                _save_lost(run_dir, server, hub, rollouts, steps, carry, end, clock.now() - t0)
                return
            with ProxyClient(proxy.url, timeout=30.0) as pc:
                try:
                    end["proxy"] = preempt.add_proxy(carry.get("proxy", {}), pc.stats())
                except GyreError:  # under SLURM the preemption signal may have reached the proxy too
                    if not reason.startswith("preempted"):
                        raise
                    end["proxy"] = carry.get("proxy", {})
            if reason.startswith("preempted"):
                _save_resume(run_dir, server, hub, rollouts, steps, {**carry, "proxy": end["proxy"]}, policy,
                             preemption, end, clock.now() - t0)
            end["groups_cut"] = rollouts.stop()
            server.lost_groups.poll(server.log.write)  # the groups that completed since the last pass

        server = LiveServer(policy, cfg.allocator, transport, log, admit=rollouts.admit,
                            runs_per_query=cfg.agent.runs_per_group, hub=hub, before_shutdown=before_shutdown,
                            progress=progress, preemption=preemption, teardown=teardown,
                            ready=lambda: rollouts.engines_serve(
                                [c for c, cs in enumerate(server.state.cells) if cs.role is Role.ROLLOUT]))
        rollouts.post = server.post
        if saved:
            steps.extend(saved["steps"])
            _restore(saved, run_dir, server, hub, rollouts, policy, reissue)
        server.lost_groups = dataloss.LostGroups(lambda: rollouts.groups, cfg.allocator.max_lost_group_share,
                                                 cfg.allocator.steps * cfg.scheduler.batch_groups)
        stop = server.run()
    except BaseException as exc:
        where = _resume_after_error(run_dir, locals().get("server"), locals().get("hub"), locals().get("rollouts"),
                                    steps, carry, exc)
        _error_event(run_dir, cfg.allocator.events_file, transport, exc, where)
        if tracker is not None:
            tracker.close(finished=False, timeout=5.0)
        raise
    finally:
        if proxy is not None:
            proxy.stop()
    if tracker is not None and stop["reason"].startswith(("preempted", lost.REASON)):  # else: after the summary
        tracker.kept(None)  # every step rank 0 holds is in the resume state it saved
        _close_tracker(run_dir, cfg.allocator.events_file, transport, tracker, finished=False)
    if stop["reason"].startswith(lost.REASON):
        return {"rank_lost": stop["reason"], "saved": end.get("lost_saved"), "error": end.get("lost_error"),
                "steps_done": stop["steps_done"], "run_dir": str(run_dir)}
    if stop["reason"].startswith("preempted"):
        return {"preempted": stop["reason"], "saved": "saved" in end, "error": end.get("preempt_error"),
                "steps_done": stop["steps_done"], "run_dir": str(run_dir)}
    summary = _summary(cfg, run_dir, stop, steps, rollouts, end, carry, clock.now() - t0)
    summary.update(live_prediction(run_dir, summary["wall_s"]))  # the simulator's replay of this run
    atomic_write_json(run_dir / "summary.json", summary)
    with tracking.PLOT_LOCK:  # a mid-run render of the trackers' PNGs may still be drawing
        _report(run_dir, cfg.allocator.events_file, cfg.cluster.cells, steps, rollouts)
    if tracker is not None:
        tracker.finish(summary, steps[-1]["step"] if steps else 0, [run_dir / f"{n}.png" for n in REPORT_PNGS])
        _close_tracker(run_dir, cfg.allocator.events_file, transport, tracker, finished=True)
    shutil.rmtree(resume.resume_dir(run_dir), ignore_errors=True)  # finished: nothing left to resume
    lost.drop_held(run_dir)
    return summary


REPORT_PNGS = ("roles", "reward", "staleness", "query_durations")


def _close_tracker(run_dir: Path, events_file: str, transport, tracker, finished: bool) -> None:
    """Let the backends take what they hold (tracking.close_timeout_s at most); their failures as events."""
    tracker.close(finished=finished)
    log = EventLog(run_dir / events_file, transport.clock)
    try:
        tracking.flush_errors(tracker, log.write)
    finally:
        log.close()


def _load_resume(cfg: GyreConfig, run_dir: Path) -> dict | None:
    """The resume state of ``run_dir`` if it holds one (checked before any process starts its work)."""
    if not resume.exists(run_dir):
        if not (run_dir / "config.yaml").is_file():  # srun's ranks of a plain sbatch: the config resumes check
            atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return None
    saved = resume.load(run_dir)
    if saved["sched"]["steps_done"] >= cfg.allocator.steps:
        raise ConfigError(f"allocator.steps: {cfg.allocator.steps}, but {run_dir} has "
                          f"{saved['sched']['steps_done']} steps done already; ask for more steps")
    (run_dir / "weights" / "LATEST.json").unlink(missing_ok=True)  # its transfer descriptor died with the run
    return saved


def _resume_after_error(run_dir: Path, server, hub, rollouts, steps: list[dict], carry: dict,
                        exc: BaseException) -> str | None:
    """Rank 0 failed: a resume state if the run stands at a quiet point (the allocator applied the core's last step
    and no step is out), as for a preemption; else None. Best effort (the error may be a full disk)."""
    if isinstance(exc, KeyboardInterrupt) or server is None or hub is None or rollouts is None or not server.started:
        return None  # not started: nothing new to save (a resumed run's earlier state stays as it was)
    if hub.step_pending or not steps and hub.version:
        return None
    try:
        rollouts.close()
        state = preempt.snapshot(server, hub, rollouts, steps, carry, 0.0)
        resume.save(run_dir, state, preempt.checkpoint_dir(run_dir))
    except (GyreError, OSError):
        return None
    return str(resume.resume_dir(run_dir))


def _error_event(run_dir: Path, events_file: str, transport, exc: BaseException, resume_at: str | None) -> None:
    """An unrecoverable error on rank 0: one ``error`` event in events.jsonl (best effort: the disk may be full)."""
    if isinstance(exc, KeyboardInterrupt):
        return
    rec = {"event": "error", "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500], "resume": resume_at}
    try:
        log = EventLog(run_dir / events_file, transport.clock)
        try:
            log.write(rec)
        finally:
            log.close()
    except OSError:
        pass


def _restore(saved: dict, run_dir: Path, server: "LiveServer", hub: Hub, rollouts: Rollouts, policy,
             reissue: bool) -> None:
    groups = preempt.restore(saved, server, hub, rollouts, server.clock.now(), reissue)
    atomic_write_text(run_dir / "metrics.jsonl", "".join(json.dumps(s) + "\n" for s in saved["steps"]))
    st = server.state
    server.log.write({"event": "resumed", "version": st.version, "steps_done": st.steps_done,
                      "buffer": [g.gid for g in groups], "trained_batches": st.trained_batches,
                      "lag_sum": st.lag_sum, "window": policy.window(st), "next_gid": rollouts.next_gid,
                      "segment": saved["counters"]["segments"] + 1,
                      "reissued": preempt.reissued(saved, reissue),
                      "dropped": [] if reissue else list(saved.get("inflight", []))})


def _save_resume(run_dir: Path, server: "LiveServer", hub: Hub, rollouts: Rollouts, steps: list[dict],
                 carry: dict, policy, preemption: preempt.Preemption, end: dict, wall_s: float) -> None:
    """Write RUN_DIR/resume; a failure is logged (``preempt_failed``) and the shutdown goes on."""
    state = preempt.snapshot(server, hub, rollouts, steps, carry, wall_s)
    st = server.state
    try:
        resume.save(run_dir, state, preempt.checkpoint_dir(run_dir))
    except (GyreError, OSError) as exc:
        end["preempt_error"] = str(exc)
        server.log.write({"event": "preempt_failed", "error": str(exc)})
        return
    end["saved"] = True
    (run_dir / preempt.REQUEST_FILE).unlink(missing_ok=True)  # served: a resumed run must not stop at once
    server.log.write({"event": "preempted", "signal": preemption.signal, "version": state["version"],
                      "steps_done": st.steps_done, "buffer": [g["gid"] for g in state["buffer"]],
                      "trained_batches": st.trained_batches, "lag_sum": st.lag_sum, "window": policy.window(st),
                      "next_gid": state["next_gid"], "inflight": state["inflight"],
                      "resume": str(resume.resume_dir(run_dir))})


def _save_lost(run_dir: Path, server: "LiveServer", hub: Hub, rollouts: Rollouts, steps: list[dict],
               carry: dict, end: dict, wall_s: float) -> None:
    """A rank is lost: RUN_DIR/resume from what rank 0 holds (live.lost); a failure is logged, never raised."""
    try:
        state = lost.snapshot(server, hub, rollouts, steps, carry, wall_s)
        path = lost.save(run_dir, state)
    except (GyreError, OSError) as exc:
        end["lost_error"] = str(exc)
        server.log.write({"event": "lost_rank_unsaved", "error": str(exc)})
        return
    end["lost_saved"] = str(path)
    server.log.write({"event": "lost_rank_saved", "version": state["version"],
                      "steps_done": state["sched"]["steps_done"], "buffer": [g["gid"] for g in state["buffer"]],
                      "inflight": state["inflight"], "resume": str(path),
                      "after_signal_s": round(server.teardown.since_s(), 3)})


def _summary(cfg: GyreConfig, run_dir: Path, stop: dict, steps: list[dict], rollouts: Rollouts, end: dict, carry: dict,
             wall: float) -> dict:
    cells = [json.loads(p.read_text()) for p in sorted((run_dir / "cells").glob("cell*.json"))]
    switches = [s for c in cells for s in c["switches"]]
    pulls = [p for c in cells for p in c["pulls"]]
    rewards = [s["reward"] for s in steps if s.get("reward") is not None]
    lag_tokens = sum(s["lag_tokens"] for s in steps)
    proxy = end.get("proxy", {})
    records = read_events(run_dir / cfg.allocator.events_file)
    events = [e["event"] for e in records]
    statuses = [s for g in rollouts.groups for s in g["statuses"]]
    loss = dataloss.summary(rollouts.groups)
    return {
        "policy": cfg.scheduler.policy, "steps": len(steps), "wall_s": round(carry.get("wall_s", 0.0) + wall, 2),
        "segments": carry.get("segments", 0) + 1,
        "switches_r2t": sum(s["to"] == "train" for s in switches),
        "switches_t2r": sum(s["to"] == "rollout" for s in switches),
        "weight_pulls": len(pulls),
        "weight_pull_checksum_ok": bool(pulls) and all(p["checksum_ok"] for p in pulls),
        "runs_finished": carry.get("runs_finished", 0) + rollouts.ended_runs, "runs_scored": sum(len(g["rewards"]) for g in rollouts.groups),
        "run_statuses": {k: statuses.count(k) for k in sorted(set(statuses))},
        "runs_lost": (proxy.get("runs_lost") or 0) + loss["runs_lost_in_groups"],
        "groups_lost": loss["groups_lost"], "lost_groups": loss["lost_groups"],
        "calls_late": proxy.get("calls_late", 0), "outcomes_recovered": proxy.get("outcomes_recovered", 0),
        "runs_moved": proxy.get("runs_moved"),
        "calls_moved": proxy.get("moves"), "groups_cut_at_stop": end.get("groups_cut", 0),
        "runs_moved_kv": proxy.get("runs_moved_kv"),  # runs with a move whose KV blocks went over Mooncake
        "moves_by_kind": {k: proxy.get(f"moves_{k}") for k in ("kv", "reprefill")},
        "kv_move_median_s": proxy.get("kv_move_median_s"),
        "prefix_hit_rate": (round(proxy["cached_tokens"] / proxy["prompt_tokens"], 4)
                            if proxy.get("prompt_tokens") else None),  # engines' cached_tokens / prompt tokens
        "engine_deaths": events.count("engine_died"), "engine_restarts": events.count("engine_restarted"),
        "engine_kind": cfg.engine.kind,  # each live engine's /model_info weight_version when its cell ended
        "engine_weight_versions": {f"cell{c['cell']}": c["engine_weight_version"] for c in cells
                                   if c.get("engine_weight_version") is not None},
        "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
        "staleness_mean": (sum(s["staleness_mean"] * s["lag_tokens"] for s in steps) / lag_tokens
                           if lag_tokens else 0.0),
        "staleness_max": max((s["staleness_max"] for s in steps), default=0),
        **{f"staleness_{part}_{stat}": _staleness(steps, f"staleness_{part}_{stat}")
           for part in ("prequeue", "inqueue") for stat in ("mean", "max")},
        **agreement.combine(steps),  # train-inference logprob agreement over every step's first forwards
        "role_share": role_share(records, cfg.cluster.cells),  # of cell-time: roles.png's title (loading = restarts)
        "switch_s": {d: _median([s[f"{d}_s"] for s in switches if f"{d}_s" in s])
                     for d in ("total", "drain", "engine_stop", "engine_sleep", "weight_pull", "engine_start",
                               "engine_wake")},
        "queries_reissued": carry.get("queries_reissued", 0),
        "queries_dropped_at_preempt": carry.get("queries_dropped_at_preempt", 0),
        "workers": sum(max(c.get("workers_trained", 0), c.get("workers_served", 0)) for c in cells),  # that worked
        "parallel": next((s["parallel"] for s in reversed(steps) if s.get("parallel")), None),  # the last step's
        "build_errors": rollouts.errors, "stop": stop, "run_dir": str(run_dir),
        **({"error": stop["reason"][len("error: "):]} if stop["reason"].startswith("error: data loss") else {}),
    }


def _staleness(steps: list[dict], key: str) -> float:
    """A staleness field over the whole run: maxima of the steps, or means weighted by trained tokens."""
    if key.endswith("_max"):
        return max((s.get(key, 0) for s in steps), default=0)
    tokens = sum(s["lag_tokens"] for s in steps)
    return sum(s.get(key, 0.0) * s["lag_tokens"] for s in steps) / tokens if tokens else 0.0


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def _report(run_dir: Path, events_file: str, cells: int, steps: list[dict], rollouts: Rollouts) -> None:
    from gyre_hpc.allocator.eventlog import read_events
    from gyre_hpc.report.live_plots import query_durations, role_timeline, staleness_split
    from gyre_hpc.report.train_plots import reward_curve

    rewards = [s["reward"] for s in steps if s.get("reward") is not None]
    if rewards:
        reward_curve(rewards, run_dir / "reward.png")
    role_timeline(read_events(run_dir / events_file), cells, run_dir / "roles.png")
    query_durations([g["seconds"] for g in rollouts.groups], run_dir / "query_durations.png")
    if steps:
        staleness_split(steps, run_dir / "staleness.png")
