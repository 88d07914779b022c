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

Rank 0's run is a ``RootRun`` driven through four phases by ``run_root``; each phase's objects are named fields, set
once, in this order, and the hub, the harness and the server call back into the run through its methods (the
callback interface below), never through closures over names assigned later::

    RootRun(cfg, run_dir, transport, comm, ...)   loads RUN_DIR/resume (if any), opens the tracker
      start_proxy()   proxy (subprocess) ─▶ its URL broadcast to the cells; the policy; the event log
      wire()          hub, rollouts, server; a resume state restored into them; the data-loss watch
      run()           LiveServer.run() until its stop reason (a StopReason)
      finish(stop)    a JobOutcome: FINISHED (summary.json, report, tracker), PREEMPTED or RANK_LOST (resume state)
    a failure in start_proxy, wire or run: ``fail`` (a resume state if quiet, one ``error`` event, the tracker
    closed), then the proxy stops and the exception goes on; a failure in finish goes on as it is

    who calls back        RootRun method        what it does
    Hub                   role_of(c)            the allocator's role of cell c
                          on_step(rec)          the core's step: allocator, events, metrics, tracker, periodic save
                          burst_open()          the policy's burst window (batches.burst_open)
                          write_event(rec)      the run's event log
    Rollouts              post(msg)             GroupsReady / RunsChanged to the allocator loop
    LiveServer            progress()            one progress line (and the tracker's roles)
                          engines_ready()       every ROLLOUT cell's engine serves
                          before_shutdown(r)    save the resume state (preempted, rank lost), cut the runs

Invariants (tests/integration/test_live_training.py, tests/unit/test_root_run.py)
- Every decision comes from the same policy object the simulator drives (``make_policy``).
- ``run_root`` returns one type, a ``lifecycle.recovery.JobOutcome`` (its kind, the stop reason, the resume state
  saved or why not, the summary of a finished run); a callback used before ``wire`` set its object is a
  ``GyreError``, never an AttributeError on None (the harness's ``post`` excepted: dropped until the server exists,
  as its monitor may report first).
- A step is reported once, by the core's STEPPED on the data plane: ``LiveServer.apply_step`` applies it to the
  allocator's state in the pass the hub takes it, so the allocator's version always equals the hub's.
- Every optimizer step is in the event log (``train_step``: version, groups, staleness, reward) and in
  ``metrics.jsonl``; the summary is computed from those records and the cells' stats, never estimated.
  A resumed run's summary covers every segment (the saved step records and counters plus the new ones).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gyre_hpc.allocator import batches
from gyre_hpc.allocator.eventlog import EventLog
from gyre_hpc.allocator.messages import Event
from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.sim.replay import live_prediction
from gyre_hpc.allocator.types import Role
from gyre_hpc.config import GyreConfig, to_dict
from gyre_hpc.errors import GyreError
from gyre_hpc.files.io import atomic_write_json
from gyre_hpc.lifecycle import resume
from gyre_hpc.lifecycle.recovery import JobOutcome, OutcomeKind, StopKind, StopReason
from gyre_hpc.live import dataloss, lost, periodic, preempt
from gyre_hpc.live import root_files as files
from gyre_hpc.live.hub import Hub
from gyre_hpc.live.rollouts import Rollouts
from gyre_hpc.live.root_server import LiveServer
from gyre_hpc.tracking import live as tracking
from gyre_hpc.tracking.plan import flat_params

def launch_proxy(pcfg, host: str, log_path: Path, config_dir: Path):
    """The proxy subprocess on a free port (a port taken before the proxy binds it: another port)."""
    from gyre_hpc.engines.launch import on_free_port
    from gyre_hpc.proxy.launch import start_proxy as start

    return on_free_port(start, pcfg, host=host, log_path=log_path, config_dir=config_dir)


@dataclass(eq=False)
class RootRun:
    """Rank 0's live run (module docstring: its phases and the callbacks the hub, harness and server make)."""

    cfg: GyreConfig
    run_dir: Path
    transport: Any  # the control world (MpiTransport); its clock is the run's one clock
    comm: Any  # the data-plane communicator: the proxy's URL goes out on it, the hub's groups too
    preemption: preempt.Preemption = field(default_factory=preempt.Preemption)
    teardown: lost.Teardown | None = None
    proxy_starter: Callable[..., Any] = launch_proxy  # the boundary to the proxy subprocess
    # the run's own state, from RUN_DIR/resume when it holds one
    saved: dict | None = field(init=False, default=None)
    carry: dict = field(init=False, default_factory=dict)  # counters of the earlier segments
    steps: list[dict] = field(init=False, default_factory=list)  # every step record, earlier segments' first
    end: dict = field(init=False, default_factory=dict)  # what the shutdown learned (proxy stats, saves)
    tracker: Any = field(init=False, default=None)
    # set by the phases, in order
    proxy: Any = field(init=False, default=None)  # start_proxy
    policy: Any = field(init=False, default=None)
    log: EventLog | None = field(init=False, default=None)
    hub: Hub | None = field(init=False, default=None)  # wire
    rollouts: Rollouts | None = field(init=False, default=None)
    server: LiveServer | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.clock = self.transport.clock  # the event log's, the allocator's and the run's wall time
        self.t0 = self.clock.now()
        self.reissue = self.cfg.allocator.preempt_inflight == "reissue"
        self.saved = files.load_resume(self.cfg, self.run_dir)
        self.carry = preempt.inflight_counters(self.saved, self.reissue) if self.saved else {}
        self.tracker = tracking.for_run(self.cfg.tracking, self.run_dir, self.saved,  # rank 0's sink
                                        params=flat_params(to_dict(self.cfg)),
                                        hold_steps=self.cfg.run.resume_every_steps > 0,
                                        tags={"policy": self.cfg.scheduler.policy})

    # ------------------------------------------------------------------ phases
    def start_proxy(self) -> None:
        """The proxy (its event log and TITO in the run dir), its URL to the cells, the policy and the event log."""
        cfg, run_dir = self.cfg, self.run_dir
        pcfg = dataclasses.replace(cfg.proxy, event_log=str(run_dir / "proxy-events.jsonl"),
                                   tito_dir=str(run_dir / "tito"))
        if pcfg.openai.tokenizer is None and cfg.model.hf_path is not None:  # the OpenAI endpoint's chat template
            pcfg = dataclasses.replace(pcfg, openai=dataclasses.replace(pcfg.openai, tokenizer=cfg.model.hf_path))
        self.proxy = self.proxy_starter(pcfg, host=cfg.proxy.host, log_path=run_dir / "proxy.log",
                                        config_dir=run_dir)
        self.comm.bcast(self.proxy.url, root=0)
        self.policy = make_policy(cfg.scheduler.policy, cfg.scheduler, cfg.cluster.cells)
        self.log = EventLog(run_dir / cfg.allocator.events_file, self.clock)
        tracking.tee(self.log, self.tracker)

    def wire(self) -> None:
        """The hub, the harness and the allocator server, each given this run as its callback interface; then
        the resume state restored into them and the data-loss watch."""
        cfg = self.cfg
        self.hub = Hub(self.comm, cfg.scheduler.batch_groups, self.policy.streaming, cfg.cluster.cells,
                       self.role_of, self.on_step, burst_open=self.burst_open, on_event=self.write_event)
        self.rollouts = Rollouts(self.run_dir, self.proxy.url, self.hub.offer, fixed_batches=not self.policy.streaming,
                                 clock=self.clock, agent=cfg.agent, grader=cfg.grader, model=cfg.model,
                                 engine=cfg.engine, trajectory=cfg.trajectory, seed=cfg.run.seed,
                                 cells=cfg.cluster.cells, batch_groups=cfg.scheduler.batch_groups, post=self.post)
        self.preemption.on_signal = self.rollouts.close  # from the signal on, no group starts or joins the buffer
        if self.preemption.requested:
            self.rollouts.close()
        self.server = LiveServer(self.policy, cfg.allocator, self.transport, self.log, admit=self.rollouts.admit,
                                 runs_per_query=cfg.agent.runs_per_group, hub=self.hub,
                                 before_shutdown=self.before_shutdown, progress=self.progress,
                                 preemption=self.preemption, teardown=self.teardown, ready=self.engines_ready)
        if self.saved:
            self.steps.extend(self.saved["steps"])
            files.restore(self.saved, self.run_dir, self.server, self.hub, self.rollouts, self.policy, self.reissue)
        self.server.lost_groups = dataloss.LostGroups(lambda: self.rollouts.groups, cfg.allocator.max_lost_group_share,
                                                      cfg.allocator.steps * cfg.scheduler.batch_groups)

    def run(self) -> dict:
        """The allocator loop until its stop reason; its stop record (``reason``, ``steps_done``, ...)."""
        return self._wired(self.server).run()

    def fail(self, exc: BaseException) -> None:
        """A phase raised ``exc``: a resume state if the run stands at a quiet point, one ``error`` event, the
        tracker closed (the caller stops the proxy and lets ``exc`` go on)."""
        where = files.resume_after_error(self.run_dir, self.server, self.hub, self.rollouts, self.steps, self.carry,
                                         exc)
        files.error_event(self.run_dir, self.cfg.allocator.events_file, self.transport, exc, where)
        if self.tracker is not None:
            self.tracker.close(finished=False, timeout=5.0)

    def stop_proxy(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()

    def finish(self, stop: dict) -> JobOutcome:
        """The outcome of the stopped run: preempted or rank lost (the resume state saved by ``before_shutdown``),
        else finished: summary.json, the report, the tracker's last word, no resume state left."""
        cfg, run_dir, reason = self.cfg, self.run_dir, StopReason.parse(stop["reason"])
        if self.tracker is not None and reason.saves_resume:  # else: after the summary
            self.tracker.kept(None)  # every step rank 0 holds is in the resume state it saved
            files.close_tracker(run_dir, cfg.allocator.events_file, self.transport, self.tracker, finished=False)
        common = dict(reason=reason, steps_done=stop["steps_done"], run_dir=str(run_dir))
        if reason.kind is StopKind.RANK_LOST:
            return JobOutcome(OutcomeKind.RANK_LOST, resume=self.end.get("lost_saved"), error=self.end.get("lost_error"),
                           **common)
        if reason.kind is StopKind.PREEMPTED:
            saved = str(resume.resume_dir(run_dir)) if self.end.get("saved") else None
            return JobOutcome(OutcomeKind.PREEMPTED, resume=saved, error=self.end.get("preempt_error"), **common)
        rollouts = self._wired(self.rollouts)
        summary = files.summary(cfg, run_dir, stop, self.steps, rollouts, self.end, self.carry,
                                self.clock.now() - self.t0)
        summary.update(live_prediction(run_dir, summary["wall_s"]))  # the simulator's replay of this run
        atomic_write_json(run_dir / "summary.json", summary)
        with tracking.PLOT_LOCK:  # a mid-run render of the trackers' PNGs may still be drawing
            files.report(run_dir, cfg.allocator.events_file, cfg.cluster.cells, self.steps, rollouts)
        if self.tracker is not None:
            self.tracker.finish(summary, self.steps[-1]["step"] if self.steps else 0,
                                [run_dir / f"{n}.png" for n in files.REPORT_PNGS])
            files.close_tracker(run_dir, cfg.allocator.events_file, self.transport, self.tracker, finished=True)
        shutil.rmtree(resume.resume_dir(run_dir), ignore_errors=True)  # finished: nothing left to resume
        lost.drop_held(run_dir)
        return JobOutcome(OutcomeKind.FINISHED, summary=summary, **common)

    # ------------------------------------------------------------------ the callback interface
    @staticmethod
    def _wired(obj):
        if obj is None:
            raise GyreError("rank 0's run was called back before wire() set up the hub, the harness and the server")
        return obj

    def role_of(self, cell: int) -> Role:
        return self._wired(self.server).state.cells[cell].role

    def burst_open(self) -> bool:
        return batches.burst_open(self.policy.mu, self._wired(self.server).state.burst_steps)

    def write_event(self, rec: dict) -> None:
        self._wired(self.server).log.write(rec)

    def post(self, msg: Event) -> None:
        """A message of the harness to the allocator loop; dropped until ``wire`` made the server (the harness's
        monitor may report before it: the allocator starts from its next report)."""
        if self.server is not None:
            self.server.post(msg)

    def engines_ready(self) -> bool:
        server = self._wired(self.server)
        return self._wired(self.rollouts).engines_serve(
            [c for c, cs in enumerate(server.state.cells) if cs.role is Role.ROLLOUT])

    def on_step(self, rec: dict) -> None:
        """The core's STEPPED, taken by the hub: the step's one report reaches the allocator here."""
        server, cfg, tracker = self._wired(self.server), self.cfg, self.tracker
        server.apply_step(rec, rec.pop("progress", {}))
        self.steps.append(rec)
        lost.hold(self.run_dir, rec["version"])  # the checkpoint a lost rank's resume state uses
        server.log.write({"event": "train_step", **rec})
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        if tracker is not None:
            tracker.step(rec, self.clock.now())
            if tracking.images_due(cfg.tracking, len(self.steps), cfg.allocator.steps):  # drawn on its own thread
                snap, secs = list(self.steps), [g["seconds"] for g in self._wired(self.rollouts).groups]
                tracker.render(lambda: tracking.render_plots(self.run_dir, cfg.allocator.events_file,
                                                             cfg.cluster.cells, snap, secs), rec["step"])
        if periodic.due(len(self.steps), cfg.run.resume_every_steps, cfg.allocator.steps):  # rank 0 may die later
            ev = periodic.save(self.run_dir, server, self.hub, self.rollouts, self.steps, self.carry,
                               self.clock.now() - self.t0, server.log.write)
            if tracker is not None and ev.get("event") == "resume_saved":
                tracker.kept(rec["step"])
        self.progress()

    def progress(self) -> None:
        server, tracker = self._wired(self.server), self.tracker
        st = server.state
        roles = {r.value: sum(c.role is r for c in st.cells) for r in Role}
        if tracker is not None:
            tracker.observe_roles(self.clock.now(), roles)
            tracking.flush_errors(tracker, server.log.write)
        last = self.steps[-1] if self.steps else {}
        reward = last.get("reward")
        print(f"[gyre {self.cfg.scheduler.policy}] step {st.steps_done}/{self.cfg.allocator.steps} "
              f"cells rollout={roles['rollout']} train={roles['train']} "
              f"switching={roles['draining'] + roles['loading']} lost={roles['lost']} | "
              f"ready {st.ready_groups} inflight {st.inflight_groups} | "
              f"staleness {last.get('staleness_mean', 0.0):.2f} = {last.get('staleness_prequeue_mean', 0.0):.2f}"
              f" pre + {last.get('staleness_inqueue_mean', 0.0):.2f} queued (max {last.get('staleness_max', 0)}) | "
              f"reward {'-' if reward is None else f'{reward:.3f}'} | {self.clock.now() - self.t0:.0f}s",
              file=sys.stderr, flush=True)

    def before_shutdown(self, reason: StopReason) -> None:
        """The loop stopped: a lost rank saves first and only (mpirun kills rank 0 KILL_AFTER_S from now); else the
        proxy's counters, the resume state of a preemption, the runs cut, the last lost groups logged."""
        server, hub, rollouts = self._wired(self.server), self.hub, self._wired(self.rollouts)
        wall = self.clock.now() - self.t0
        if reason.kind is StopKind.RANK_LOST:
            files.save_lost(self.run_dir, server, hub, rollouts, self.steps, self.carry, self.end, wall)
            return
        from gyre_hpc.proxy.client import ProxyClient

        with ProxyClient(self.proxy.url, timeout=30.0) as pc:
            try:
                self.end["proxy"] = preempt.add_proxy(self.carry.get("proxy", {}), pc.stats())
            except GyreError:  # under SLURM the preemption signal may have reached the proxy too
                if reason.kind is not StopKind.PREEMPTED:
                    raise
                self.end["proxy"] = self.carry.get("proxy", {})
        if reason.kind is StopKind.PREEMPTED:
            files.save_resume(self.run_dir, server, hub, rollouts, self.steps,
                              {**self.carry, "proxy": self.end["proxy"]}, self.policy, self.preemption, self.end,
                              self.clock.now() - self.t0)
        self.end["groups_cut"] = rollouts.stop()
        server.lost_groups.poll(server.log.write)  # the groups that completed since the last pass


def run_root(cfg: GyreConfig, run_dir: Path, transport, comm, preemption: preempt.Preemption | None = None,
             teardown: lost.Teardown | None = None) -> JobOutcome:
    """Drive the live run from rank 0 through its phases (``RootRun``); its ``JobOutcome``: finished (the summary,
    also in summary.json), preempted or rank lost (the resume state saved, or why not)."""
    return drive(RootRun(cfg, run_dir, transport, comm, preemption or preempt.Preemption(), teardown))


def drive(root: RootRun) -> JobOutcome:
    """``root``'s phases in order; a failure of the first three is ``root.fail``'s, and the proxy stops after
    them whatever happened."""
    try:
        root.start_proxy()
        root.wire()
        stop = root.run()
    except BaseException as exc:
        root.fail(exc)
        raise
    finally:
        root.stop_proxy()
    return root.finish(stop)
