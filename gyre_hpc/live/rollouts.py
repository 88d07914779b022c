"""Rank 0's rollout driver (edge): the agent harness behind the proxy, in its own asyncio thread.

::

    allocator loop ── admit(n) ──▶ n new groups (queries) start; their runs call the proxy
    group's runs all ended ──▶ proxy /admin/flush_tito (with the runs' outcomes) → tito/q<gid>.jsonl
                               ──▶ integrity check (file vs the proxy's counts vs harness) ──▶ build_batch
                               (tree, J_max, scoring) ──▶ one line of groups.jsonl (admit/ready times, per-run
                               end, trained tokens) ──▶ hub.offer(group) and GroupsReady(1, work_s)
                               (fixed batches: held until the whole batch is ready, then all B in order)
    every 0.25 s ──▶ RunsChanged(runs per cell from the proxy's in-flight counts, runs ended)

Invariants (tests/integration/test_live_training.py)
- Groups become ready in completion order; each is offered to the hub exactly once, after its TITO file is
  complete: the flush carries every run's outcome (whatever happened to the harness's post), so each run of
  the group has exactly one outcome record in the file before the group is built.
- A group trains only if its file passes ``trajectory.integrity.check_group``; otherwise (or if the file cannot
  be read or packed) it is *lost*: offered empty (its batch slot trains nothing), ``lost`` is the reason in
  ``groups``, its runs count as neither scored nor trained (``live.dataloss`` logs and limits it).
- Fixed batches (non-streaming policies, as in the simulator): batch b = the groups admitted b*B .. b*B+B-1
  (counted from 0; after a resume from the groups held and re-issued, then the first new one: live/preempt.py);
  a ready group is held until every group of its batch is ready and every earlier batch went out, then the
  batch goes to the hub in admission order with one GroupsReady(B) (``allocator.batches.FixedBatches``). So a
  batch waits for its slowest query, as colocate and async do by definition — not for any B groups that happen
  to finish first.
- Every started run ends with an outcome (the harness's guarantee); ``stop()`` cancels the runs still going
  (they end ``aborted``) and counts them apart from the finished ones.
- After ``close()`` (preemption) no group is offered and none is started: the trajectory buffer saved for the
  resume is what the hub held when the preemption signal came; ``inflight()`` is every group admitted and not
  ready then (the queries a resume re-issues, or counts as dropped). ``reissue(gids)`` makes the next
  ``admit`` start those queries again, before any new one (a query is a pure function of its gid and the
  seed); the TITO file an interrupted attempt left (runs that had finished and flushed, a group not yet built)
  is moved to tito/interrupted/ first (``set_aside``), so the re-issued runs' records are the file's only ones.
  ``rebuild`` turns a buffered group's TITO file back into the same training group (the batch is a pure
  function of the file and the config).
- ``lock`` is held while a group leaves the queries in flight (``readied``) and is held for its fixed batch or
  offered to the hub, and by the periodic snapshot (live/periodic.py), which therefore sees each admitted group
  in exactly one place; ``set_aside_from(next_gid)`` moves aside the files of queries admitted after an older
  periodic state, before a resume admits those gids again.
"""
from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Callable

from gyre_hpc.agents.harness import Harness
from gyre_hpc.agents.plugin_harness import PluginHarness
from gyre_hpc.allocator.messages import GroupsReady, RunsChanged
from gyre_hpc.live import dataplane as dp
from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import AgentConfig, EngineConfig, GraderConfig, ModelConfig, TrajectoryConfig
from gyre_hpc.errors import GyreError
from gyre_hpc.allocator.batches import FixedBatches
from gyre_hpc.trajectory.records import TitoLog, outcome_record, read_tito

WORK_S_PER_TOKEN = 2e-4  # rough CPU training cost per packed token, for the policies' backlog estimate


def work_s(groups: list[dp.Group]) -> float:
    """The policies' estimate of the training work in ``groups`` (cell-seconds)."""
    return sum(WORK_S_PER_TOKEN * (g.batch.tokens if g.batch is not None else 0) for g in groups)


class Rollouts:
    def __init__(self, run_dir: Path, proxy_url: str, offer: Callable[[dp.Group], None],
                 fixed_batches: bool = False, clock: Clock | None = None, *, agent: AgentConfig, grader: GraderConfig,
                 model: ModelConfig, engine: EngineConfig, trajectory: TrajectoryConfig, seed: int, cells: int,
                 batch_groups: int, post: Callable | None = None):
        """``cells``: ``cluster.cells``; ``batch_groups``: ``scheduler.batch_groups`` (the fixed batches' size);
        ``post``: where GroupsReady and RunsChanged go (the allocator loop's ``post``; none: dropped)."""
        self.run_dir, self.proxy_url, self.offer = Path(run_dir), proxy_url, offer
        self.agent, self.vocab_size, self.trajectory, self.cells = agent, model.vocab_size, trajectory, cells
        self.clock = clock or WallClock()  # groups' admit/ready stamps (wall(): compared with TITO call times)
        self.batches = FixedBatches[dp.Group](batch_groups) if fixed_batches else None
        self.post: Callable = post or (lambda msg: None)
        self.harness = Harness(agent, proxy_url, self.run_dir / "tito" / "runs", vocab_size=model.vocab_size,
                               seed=seed, proxy=True, context_len=engine.context_len,
                               request_timeout_s=engine.request_timeout_s, clock=self.clock) \
            if agent.kind == "synthetic" \
            else PluginHarness(agent, grader, proxy_url, self.run_dir / "tito" / "runs",  # OpenAI endpoint
                               clock=self.clock)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="gyre-harness", daemon=True)
        self.thread.start()
        self.next_gid = 0
        self.started_runs = self.ended_runs = 0
        self.futures: list = []
        self.groups: list[dict] = []  # per ready group: gid, runs, rewards, statuses, seconds
        self.errors: list[str] = []
        self.closed = False
        self.lock = threading.Lock()  # held while a group goes from in flight to held/offered, and by a snapshot
        self.admitted: list[int] = []  # gids started in this segment, in order (re-issued ones first)
        self.readied: set[int] = set()  # gids that became ready (before the preemption, if any)
        self.pending_reissue: list[int] = []
        self.engine_cells: set[int] = set()  # cells with an engine registered with the proxy (the monitor's view)
        self.monitor = asyncio.run_coroutine_threadsafe(self._monitor(), self.loop)

    def engines_serve(self, cells: list[int]) -> bool:
        """Whether every one of ``cells`` has an engine registered with the proxy (the allocator starts
        admitting only then: a run admitted before any engine serves would spend its timeout waiting)."""
        return set(cells) <= self.engine_cells

    def admit(self, n: int) -> int:
        """Start ``n`` new groups (called from the allocator loop); returns how many started."""
        if self.closed:
            return 0
        for _ in range(n):
            if self.pending_reissue:
                gid = self.pending_reissue.pop(0)
            else:
                gid, self.next_gid = self.next_gid, self.next_gid + 1
            self.admitted.append(gid)
            self.started_runs += self.agent.runs_per_group
            self.futures.append(asyncio.run_coroutine_threadsafe(self._group(gid), self.loop))
        return n

    async def _group(self, gid: int) -> None:
        t0 = self.clock.wall()
        results = await self.harness.run_async([gid])
        self.ended_runs += len(results)
        try:
            group, lost = await asyncio.to_thread(self._build, gid, results)
        except GyreError as exc:  # a group that cannot be read or packed trains nothing; the run goes on
            group, lost = dp.Group(gid, None, 0, runs=len(results)), str(exc)
        if lost is not None:
            self.errors.append(f"group {gid}: {lost}")
        group.t_ready = self.clock.wall()
        group.rewards = [] if lost else [r.outcome.score for r in results if r.outcome.score is not None]
        group.runs = len(results)
        with self.lock:  # one move for a snapshot (live/periodic.py): in flight, then held or offered, never between
            if self.closed:  # preempted meanwhile: not part of the saved buffer
                return
            self._ready(gid, t0, group, results, lost)

    def _ready(self, gid: int, t0: float, group: dp.Group, results, lost: str | None) -> None:
        self.readied.add(gid)
        self.groups.append({"gid": gid, "runs": len(results), "seconds": group.t_ready - t0,
                            "rewards": group.rewards, "versions": list(group.gen_versions),
                            "statuses": [r.outcome.status.value for r in results], "lost": lost})
        self._record(gid, t0, group, results)
        if self.batches is None:
            self._release([group])
            return
        for batch in self.batches.ready(gid, group):
            self._release(batch)

    def _release(self, groups: list[dp.Group]) -> None:
        for group in groups:
            self.offer(group)
        self.post(GroupsReady(groups=len(groups), work_s=work_s(groups)))

    def close(self) -> None:
        """Preemption: start no group and offer none from now on (thread-safe: one attribute)."""
        self.closed = True

    def inflight(self) -> list[int]:
        """The queries admitted and not ready (after ``close``: those the preemption interrupted), in order."""
        ready = set(self.readied)
        return [g for g in list(self.admitted) + list(self.pending_reissue) if g not in ready]

    def reissue(self, gids: list[int]) -> None:
        """A resume: the next ``admit`` starts the queries ``gids`` first, in this order (those in flight at the
        preemption again, or the new ones a ``drop`` numbered in their places); until then ``inflight`` has them."""
        for gid in gids:
            set_aside(self.tito_path(gid))
        self.pending_reissue = list(gids)

    def set_aside_from(self, next_gid: int) -> list[Path]:
        """A resume from a periodic state: move aside the TITO files of the queries ``next_gid`` and on."""
        return set_aside_from(self.run_dir / "tito", next_gid)

    def tito_path(self, gid: int) -> Path:
        from gyre_hpc.proxy.recorder import group_file

        return self.run_dir / "tito" / group_file(gid)

    def rebuild(self, saved: dict) -> dp.Group:
        """A buffered group of a resume state, rebuilt from its TITO file; its trained tokens must match."""
        if saved["trained_tokens"] == 0:  # nothing of it trains (or it could not be packed)
            group = dp.Group(saved["gid"], None, 0, gen_versions=tuple(saved["gen_versions"]))
        else:
            group = self._batch(saved["gid"], read_tito(saved["tito"], self.vocab_size))
        if group.trained_tokens != saved["trained_tokens"] or list(group.gen_versions) != saved["gen_versions"]:
            raise GyreError(f"{saved['tito']}: rebuilt group {saved['gid']} has {group.trained_tokens} trained "
                            f"tokens of versions {list(group.gen_versions)}; the resume state saved "
                            f"{saved['trained_tokens']} of {saved['gen_versions']}")
        group.rewards, group.runs = list(saved.get("rewards", [])), saved["runs"]
        return group

    def _record(self, gid: int, t0: float, group: dp.Group, results) -> None:
        """Append the group's timing line to groups.jsonl (the simulator's replay reads it: docs/runtime.md)."""
        rec = {"gid": gid, "t_admit": t0, "t_ready": group.t_ready, "trained_tokens": group.trained_tokens,
               "runs": [{"end_s": r.outcome.t_end - t0, "status": r.outcome.status.value} for r in results]}
        with open(self.run_dir / "groups.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _build(self, gid: int, results) -> tuple[dp.Group, str | None]:
        """Flush the group's records (with its outcomes) and build its batch from the file; a group whose
        file fails the integrity check comes back empty, with the problems as the reason it is lost."""
        from gyre_hpc.proxy.client import ProxyClient
        from gyre_hpc.trajectory.integrity import Served, check_group

        path = self.tito_path(gid)
        with ProxyClient(self.proxy_url, timeout=60.0) as proxy:
            done = proxy.flush_tito(path.name, [r.run_id for r in results],  # into proxy.tito_dir = RUN_DIR/tito
                                    [outcome_record(r.outcome) for r in results])
        log = read_tito(path, self.vocab_size)
        served = {r: Served(int(n["calls"]), int(n["output_tokens"])) for r, n in done["served"].items()}
        problems = check_group(log, [r.outcome for r in results], served, {r.run_id: r.calls for r in results})
        if problems:
            versions = tuple(sorted({int(v) for c in log.calls for v in c.output_versions}))
            return dp.Group(gid, None, 0, gen_versions=versions), (
                f"{path}: {len(problems)} integrity problem(s): " + "; ".join(problems[:5]))
        return self._batch(gid, log), None

    def _batch(self, gid: int, log: TitoLog) -> dp.Group:
        from gyre_hpc.trajectory.pipeline import build_batch

        calls = log.calls
        versions = tuple(sorted({int(v) for c in calls for v in c.output_versions}))
        batch, report = build_batch(log, self.trajectory)
        if report.trained_tokens == 0:
            return dp.Group(gid, None, 0, gen_versions=versions)
        return dp.Group(gid, batch, report.trained_tokens, gen_versions=versions)

    async def _monitor(self) -> None:
        from gyre_hpc.proxy.client import ProxyClient

        cells = self.cells
        with ProxyClient(self.proxy_url, timeout=10.0) as proxy:
            while True:
                await asyncio.sleep(0.25)
                try:
                    engines = await asyncio.to_thread(proxy.engines)
                except GyreError:
                    continue
                self.engine_cells = {e["cell"] for e in engines}
                runs = [0] * cells
                for e in engines:
                    if 0 <= e["cell"] < cells:
                        runs[e["cell"]] += e["in_flight"]
                ended, unfinished = self.ended_runs, self.started_runs - self.ended_runs
                while sum(runs) > unfinished:  # subagents: a run may have two calls in flight
                    runs[runs.index(max(runs))] -= 1
                self.post(RunsChanged(runs=tuple(runs), ended=ended))

    def stop(self) -> int:
        """Cancel the runs still going (they end aborted) and stop the thread; returns how many groups were cut."""
        cut = sum(not f.done() for f in self.futures)
        asyncio.run_coroutine_threadsafe(self._cancel_all(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        return cut

    async def _cancel_all(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def set_aside(tito: Path) -> Path | None:
    """Move a re-issued query's earlier TITO file to tito/interrupted/ (a new name each time), or None if there is
    none: the proxy appends to the group file, so the re-issued runs' calls would otherwise follow the interrupted
    attempt's with the same call ids (a duplicate, and the group lost)."""
    if not tito.is_file():
        return None
    aside = tito.parent / "interrupted"
    aside.mkdir(exist_ok=True)
    n = sum(1 for _ in aside.glob(f"{tito.name}.*"))
    return tito.replace(aside / f"{tito.name}.{n}")


def set_aside_from(tito_dir: Path, next_gid: int) -> list[Path]:
    """Move the group files of gids ``next_gid`` and on to tito/interrupted/ (``set_aside``); the moved paths.
    A resume state written periodically (live/periodic.py) is older than the segment that died after it: that
    segment went on admitting queries from the saved ``next_gid``, and the resumed run admits those gids again."""
    moved = []
    for f in sorted(Path(tito_dir).glob("q*.jsonl")):
        digits = f.name[1:-len(".jsonl")]
        if digits.isdigit() and int(digits) >= next_gid and (aside := set_aside(f)) is not None:
            moved.append(aside)
    return moved
