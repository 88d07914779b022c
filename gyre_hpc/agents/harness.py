"""The live harness (edge): runs groups of agent episodes concurrently against one SGLang-protocol URL.

The URL is an engine or the proxy; the harness only speaks ``/generate`` (``AsyncEngineClient``) with a ``rid`` of
``<run_id>/<call_id>`` per call (``env.rid_for``), so a proxy can route a run's calls stickily. Tool times are
``asyncio.sleep``; each run has its own timeout (``agent.timeout_s``).
Behind the proxy each run talks with its own run key (``auth.run_key``), never the job secret: the proxy lets it
make that run's calls and nothing else.

Per run, one file ``<out_dir>/<run_id>.jsonl`` (``trajectory.records.write_tito``, atomic) is written as soon as
the run ends. Talking to an engine directly, it holds the run's calls (in finishing order) and its outcome: the
harness records TITO itself. Behind the gyre proxy (``proxy=True``) the proxy records the calls; the file holds
the outcome only, and the outcome is also posted to the proxy (``POST /tito/outcome``) so its TITO is complete.
The post is idempotent on the proxy, so one that gets no answer is sent again (``OUTCOME_POST_TRIES``); its
connections are dropped after ``KEEPALIVE.keepalive_expiry`` idle seconds, before the server closes them (a
post sent on a connection the server is closing is lost: issue 16). What still fails is in ``post_error``.

A ``/generate`` that comes back with ``finish_reason`` abort (a proxy gives up only when no engine can take the
run) is recorded as a call and re-issued from the same input, ``agent.abort_retries`` times (new call ids
``<call>a1``, ``<call>a2``); one that gets no answer at all (connection dropped, read timeout) is aborted on the
engine by its rid, not recorded, and re-issued the same way. After that, or on an HTTP error answer, the run
ends ``aborted`` with the error as detail.

Invariants
- Every started run writes exactly one outcome, whatever happens (finished, timeout, engine error, cancellation
  of the harness itself): runs are never lost.
- The recorded calls of a run are the calls it made, with the engine's own output ids, logprobs and per-token
  weight versions; a call cut by the timeout is aborted on the engine (by its rid) and not recorded.
- The harness never sends an input plus ``max_new_tokens`` longer than ``context_budget`` (checked against the
  engine's context length up front).
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import httpx
import numpy as np

from gyre_hpc.net import auth, tls
from gyre_hpc.agents.env import Episode, Generate, Tool, rid_for
from gyre_hpc.agents.workload import Workload
from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import AgentConfig
from gyre_hpc.engines.client import KEEPALIVE, AsyncEngineClient
from gyre_hpc.engines.protocol import GenerateResult
from gyre_hpc.errors import ConfigError, EngineError
from gyre_hpc.trajectory.records import Call, Outcome, TitoLog, outcome_record, read_tito, write_tito

OUTCOME_POST_TRIES = 3  # an outcome post that got no answer is sent again (the proxy accepts a repeat)


@dataclass(frozen=True, eq=False)
class RunResult:
    run_id: str
    outcome: Outcome
    calls: tuple[Call, ...]  # the calls as the harness saw them (in the file only without a proxy)
    path: Path
    kinds: dict[str, str] = field(default_factory=dict)  # call id → the branch kind the episode meant
    post_error: str | None = None  # proxy mode: why the outcome could not be posted (it is in the file anyway)


def result_call(run_id: str, query_id: str, call_id: str, action: Generate, res: GenerateResult, engine: str,
                t_start: float, t_end: float) -> Call:
    """A TITO ``Call`` from an engine answer; versions must be policy versions (decimal integers)."""
    n = len(res.output_ids)
    if res.logprobs is None or len(res.logprobs) != n:
        raise EngineError(f"{engine}: /generate answer for {run_id}/{call_id} has no logprob per output token",
                          endpoint="/generate")
    versions = np.zeros(n, np.int64)
    try:
        for span in res.weight_versions:
            versions[span.start:span.end] = int(span.version)
    except ValueError:
        raise EngineError(f"{engine}: weight version {res.weight_versions[0].version!r} is not a policy version "
                          f"(decimal optimizer step)", endpoint="/generate") from None
    return Call(run_id, query_id, call_id, np.asarray(action.input_ids, np.int64), np.asarray(res.output_ids, np.int64),
                np.minimum(np.asarray(res.logprobs, np.float64), 0.0), versions, engine, res.finish_reason,
                t_start, t_end)


class Harness:
    """Runs a workload's groups against ``url`` and writes one TITO file per run into ``out_dir``."""

    def __init__(self, cfg: AgentConfig, url: str, out_dir: str | Path, *, vocab_size: int, seed: int,
                 proxy: bool = False, context_len: int | None = None, engine_name: str | None = None,
                 request_timeout_s: float = 600.0, connect_retries: int = 3,
                 post_transport: httpx.AsyncBaseTransport | None = None, clock: Clock | None = None):
        if context_len is not None and cfg.context_budget > context_len:
            raise ConfigError(f"agent.context_budget: {cfg.context_budget} exceeds the engine's context length "
                              f"(engine.context_len={context_len})")
        self.cfg, self.url, self.out_dir = cfg, url, Path(out_dir)
        self.workload = Workload(cfg, vocab_size, seed)
        self.proxy = proxy
        self.engine_name = engine_name or url
        self._client_args = dict(timeout=request_timeout_s, connect_retries=connect_retries)
        self.post_transport = post_transport  # the outcome posts' transport (default: pooled, KEEPALIVE)
        self.clock = clock or WallClock()  # wall(): the calls' and outcomes' stamps in TITO

    def run(self, groups: Sequence[int]) -> list[RunResult]:
        """Run the groups of these query indices concurrently (all their runs at once); blocks."""
        return asyncio.run(self.run_async(groups))

    async def run_async(self, groups: Sequence[int]) -> list[RunResult]:
        episodes = [ep for g in groups for ep in self.workload.group(g)]
        if not self.proxy:
            client = AsyncEngineClient(self.url, **self._client_args)
            try:
                return list(await asyncio.gather(*(self._run(client, None, ep) for ep in episodes)))
            finally:
                await client.aclose()
        transport = self.post_transport or httpx.AsyncHTTPTransport(retries=1, limits=KEEPALIVE,
                                                                         verify=tls.context())
        try:
            return list(await asyncio.gather(*(self._run_scoped(ep, transport) for ep in episodes)))
        finally:
            await transport.aclose()

    async def _run_scoped(self, ep: Episode, transport: httpx.AsyncBaseTransport) -> RunResult:
        """Behind the proxy each run is its own agent: its clients hold its run key only (``auth.run_key``). The
        outcome posts share one pooled ``transport`` (closed by ``run_async``, so this run's post client is not)."""
        secret = auth.job_secret()
        key = auth.run_key(secret, ep.run_id) if secret else None
        client = AsyncEngineClient(self.url, token=key, **self._client_args)
        posts = httpx.AsyncClient(base_url=self.url, timeout=30.0, headers=auth.bearer(key), transport=transport)
        try:
            return await self._run(client, posts, ep)
        finally:
            await client.aclose()

    async def _run(self, client: AsyncEngineClient, posts: httpx.AsyncClient | None, ep: Episode) -> RunResult:
        calls: list[Call] = []
        inflight: dict[str, str] = {}
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                await self._drive(client, ep, calls, inflight)
            outcome = ep.outcome(self.clock.wall())
        except TimeoutError:
            await self._abort(client, inflight.get("rid"))
            outcome = ep.timeout_outcome(self.clock.wall())
        except EngineError as exc:
            outcome = ep.aborted_outcome(self.clock.wall(), str(exc))
        except BaseException as exc:  # a bug or a cancelled harness: still no run is lost
            self._write(ep, calls, ep.aborted_outcome(self.clock.wall(),
                                                      f"harness stopped: {type(exc).__name__}: {exc}"))
            raise
        path = self._write(ep, calls, outcome)
        return RunResult(ep.run_id, outcome, tuple(calls), path, dict(ep.kinds), await _post(posts, outcome))

    def _write(self, ep: Episode, calls: list[Call], outcome: Outcome) -> Path:
        return write_tito(self.out_dir / f"{ep.run_id}.jsonl", [] if self.proxy else calls, [outcome])

    async def _drive(self, client: AsyncEngineClient, ep: Episode, calls: list[Call], inflight: dict) -> None:
        actions, reply = ep.actions(), None
        while True:
            try:
                action = actions.send(reply)
            except StopIteration:
                return
            if isinstance(action, Tool):
                await asyncio.sleep(action.seconds)
                reply = None
            else:
                reply = await self._generate(client, ep, action, calls, inflight)

    async def _generate(self, client: AsyncEngineClient, ep: Episode, action: Generate, calls: list[Call],
                        inflight: dict) -> list[int]:
        """One model call; an abort or a dropped connection is re-issued (new call id) up to abort_retries."""
        last = ""
        for attempt in range(self.cfg.abort_retries + 1):
            call_id = action.call_id if attempt == 0 else f"{action.call_id}a{attempt}"
            inflight["rid"] = rid = rid_for(ep.run_id, call_id)
            params = self.workload.sampling_params(action.max_new_tokens, ep.run_id, call_id)
            t0 = self.clock.wall()
            try:
                res = await client.generate(action.input_ids, params, rid=rid, return_logprob=True)
            except EngineError as exc:
                if exc.status is not None:  # the engine answered with an error: nothing to retry
                    raise
                inflight.pop("rid", None)
                await self._abort(client, rid)  # it may still run there; free it (best effort)
                last = str(exc)
                continue
            inflight.pop("rid", None)
            calls.append(result_call(ep.run_id, ep.query_id, call_id, action, res, self.engine_name, t0,
                                     self.clock.wall()))
            if not res.aborted:
                return list(res.output_ids)
            last = f"finish_reason abort after {len(res.output_ids)} token(s)"
        raise EngineError(f"{self.url}: call {action.call_id} of run {ep.run_id} failed "
                          f"{self.cfg.abort_retries + 1} time(s) (agent.abort_retries={self.cfg.abort_retries}); "
                          f"last: {last}", endpoint="/generate")

    async def _abort(self, client: AsyncEngineClient, rid: str | None) -> None:
        """Free the engine from a call the timeout cut (best effort: the run is already over)."""
        if rid is not None:
            with contextlib.suppress(EngineError, asyncio.TimeoutError):
                await asyncio.wait_for(client.abort(rid), timeout=5.0)


async def _post(posts: httpx.AsyncClient | None, outcome: Outcome) -> str | None:
    """Proxy mode: hand the outcome to the proxy's TITO recorder; returns the error, if any."""
    if posts is None:
        return None
    body = {k: v for k, v in outcome_record(outcome).items() if k != "type"}
    error = ""
    for _ in range(OUTCOME_POST_TRIES):
        try:
            resp = await posts.post("/tito/outcome", json=body)
        except httpx.TransportError as exc:
            error = f"no answer ({type(exc).__name__}: {exc})"
            continue
        return None if resp.status_code < 400 else f"HTTP {resp.status_code}: {resp.text[:300]}"
    return f"{error} ({OUTCOME_POST_TRIES} tries)"


def read_runs(paths: Sequence[str | Path], vocab_size: int | None = None) -> TitoLog:
    """The per-run files of a harness as one validated ``TitoLog`` (calls in file order, then outcomes)."""
    logs = [read_tito(p, vocab_size) for p in paths]
    return TitoLog(tuple(c for log in logs for c in log.calls), tuple(o for log in logs for o in log.outcomes),
                   f"{len(logs)} run file(s)")
