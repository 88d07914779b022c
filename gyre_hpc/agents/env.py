"""One run of the synthetic agent, as a pure state machine that yields actions (no clock, no I/O).

``Episode.actions()`` is a generator: it yields ``Generate`` (send back the model's output ids) and ``Tool``
(sleep ``seconds``, send back None). A driver runs it: the async harness with real time and an engine, or
``workload.play`` with virtual time. ``S`` is the system prompt, ``CTXi`` the header of context ``i``::

    main    S CTX0 TASK q.. CALL | a1 TOOL f.. KEYr CALL | a2 TOOL ERR CALL ... ANSWER | answer END
    retry   a failed tool (ERR) re-issues the same model call:   S CTX0 TASK q.. CALL | a1'
    compress before a call that would pass context_budget:     S CTXj SUMMARY q.. [KEYr] CALL | ...
    subagent instead of a tool, a new context on the request:  S CTXk SUB a.. CALL | b1 TOOL f.. KEYr CALL | b2
             its result returns to the parent as tool output:  ... CALL | a2 RESULT b2.. [KEYr] CALL | a3

Rules (probabilities and sizes from ``AgentConfig``): each tool fails with ``tool_failure_prob`` and is then
retried ``max_retries`` times (the kept attempt is the last); a main-agent tool call is delegated to a subagent
with ``subagent_prob`` when the parent's context can take the result and the next call without compressing;
tool times are lognormal. Whatever the harness writes ends with the key when it carries it (right before the
next prompt marker). Every main-agent output is a *draft*; the answer is the final draft.

Invariants
- Control flow is a function of the run's seed and the lengths of the model outputs (compression), never of
  their content: the same seed and outputs give the same actions, and the same outcome.
- Every call's input is what the model will see: a continuation's input extends the previous call of its
  context by that call's output; a retry's input equals the retried call's; each context opens with ``S CTXi``
  where ``CTXi`` is distinct for the first 32 contexts of a run (so ``branches.classify`` can tell them apart).
- No input plus its ``max_new_tokens`` exceeds ``context_budget``.
- Outcomes: a finished run is ``scored`` (or ``eval_failure``, drawn once per run with ``eval_failure_rate``);
  a timed-out run with a draft is ``timeout_partial`` with the last draft's score (when ``partial_scoring``),
  else ``timeout_unscorable``; scores come from ``task.verify`` only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Sequence

import numpy as np

from gyre_hpc.agents import task as tk
from gyre_hpc.agents.task import Task, Vocab
from gyre_hpc.config import AgentConfig
from gyre_hpc.trajectory.records import Outcome, RunStatus


@dataclass(frozen=True)
class Generate:
    """Ask the model for at most ``max_new_tokens`` after ``input_ids``; ``kind`` is the branch kind meant."""

    call_id: str
    input_ids: tuple[int, ...]
    max_new_tokens: int
    kind: str  # root | continuation | retry | compression | subagent (BranchKind values)
    agent: str  # "main" or "sub<k>"


@dataclass(frozen=True)
class Tool:
    """A tool call that takes ``seconds`` and fails or reveals the key."""

    seconds: float
    failed: bool
    agent: str


Action = Generate | Tool


@dataclass
class _Context:
    agent: str
    ids: list[int]
    task: tuple[int, ...]  # what a summary restates: the query, or a subagent's request
    kind: str  # branch kind of its next call
    knows_key: bool = False
    last: list[int] = field(default_factory=list)  # its latest output


def rid_for(run_id: str, call_id: str) -> str:
    """The ``rid`` of a call: ``<run_id>/<call_id>`` (a proxy routes on the run part, records the call part)."""
    return f"{run_id}/{call_id}"


def split_rid(rid: str) -> tuple[str, str]:
    """``rid_for`` inverted: (run id, call id)."""
    run_id, _, call_id = rid.rpartition("/")
    return run_id, call_id


def _body(output: Sequence[int]) -> list[int]:
    """An output without its stop token (what a request or a result carries on)."""
    out = list(output)
    return out[:-1] if out and out[-1] == tk.END else out


class Episode:
    """Run ``run_index`` of ``task``; drive ``actions()``, then ask for the outcome."""

    def __init__(self, cfg: AgentConfig, vocab: Vocab, system: Sequence[int], task: Task, run_index: int, seed: int):
        self.cfg, self.vocab, self.system, self.task = cfg, vocab, tuple(system), task
        self.run_id = f"{task.query_id}-r{run_index}"
        self.rng = np.random.default_rng([seed, tk.RUN_STREAM, task.index, run_index])
        self.eval_fails = bool(self.rng.random() < cfg.eval_failure_rate)
        self.kinds: dict[str, str] = {}  # call id → the branch kind meant
        self.drafts: list[tuple[tuple[int, ...], int]] = []  # main-agent outputs with their max_new_tokens
        self.answer: tuple[int, ...] | None = None
        self.n_contexts = 0
        self.n_calls = 0
        self.n_subagents = 0

    @property
    def query_id(self) -> str:
        return self.task.query_id

    # ------------------------------------------------------------------------------------------ the run
    def actions(self) -> Generator[Action, list[int] | None, None]:
        main = self._open("main", [tk.TASK, *self.task.tokens], self.task.tokens, "root")
        for _ in range(self.task.turns):
            out = yield from self._tool_turn(main, delegable=True)
            if out is not None:  # delegated: a subagent works on the request
                yield from self._subagent(main, out)
        main.ids.append(tk.ANSWER)
        self.answer = tuple((yield from self._generate(main, self.cfg.answer_tokens)))

    def _open(self, agent: str, body: list[int], task: Sequence[int], kind: str) -> _Context:
        ctx = _Context(agent, [*self.system, Vocab.ctx(self.n_contexts), *body], tuple(task), kind)
        self.n_contexts += 1
        return ctx

    def _compress(self, ctx: _Context) -> None:
        """Replace the history by ``S CTXj SUMMARY task [KEYr]`` and keep the pending marker (CALL/ANSWER)."""
        marker = ctx.ids[-1]
        key = [Vocab.key(self.task.key)] if ctx.knows_key else []
        fresh = self._open(ctx.agent, [tk.SUMMARY, *ctx.task, *key], ctx.task, "compression")
        ctx.ids, ctx.kind = fresh.ids + [marker], "compression"

    def _generate(self, ctx: _Context, max_new: int, retry: bool = False):
        if not retry and len(ctx.ids) + max_new > self.cfg.context_budget:
            self._compress(ctx)
        call_id = f"c{self.n_calls}"
        self.n_calls += 1
        self.kinds[call_id] = "retry" if retry else ctx.kind
        if not retry:
            ctx.kind = "continuation"
        out = list((yield Generate(call_id, tuple(ctx.ids), max_new, self.kinds[call_id], ctx.agent)))
        ctx.last = out
        if ctx.agent == "main":
            self.drafts.append((tuple(out), max_new))
        return out

    def _tool_turn(self, ctx: _Context, delegable: bool = False):
        """``CALL`` → model call → tool (retried on failure); returns the request when delegated instead."""
        ctx.ids.append(tk.CALL)
        for attempt in range(self.cfg.max_retries + 1):
            out = yield from self._generate(ctx, self.cfg.call_tokens, retry=attempt > 0)
            if attempt == 0 and delegable and self._delegate(ctx, out):
                ctx.ids += out
                return out
            tool = self._tool(ctx.agent)
            yield tool
            if not tool.failed:
                break
        ctx.ids += out + self._tool_output(tool.failed)
        ctx.knows_key |= not tool.failed
        return None

    def _delegate(self, ctx: _Context, request: list[int]) -> bool:
        """Draw the delegation; allowed only if request, result (<= 2 + call_tokens), marker and next call fit."""
        cfg = self.cfg
        need = len(ctx.ids) + len(request) + 3 + cfg.call_tokens + max(cfg.call_tokens, cfg.answer_tokens)
        return bool(self.rng.random() < cfg.subagent_prob) and need <= cfg.context_budget

    def _subagent(self, parent: _Context, request: list[int]):
        self.n_subagents += 1
        req = _body(request)
        sub = self._open(f"sub{self.n_subagents}", [tk.SUB, *req], req, "subagent")
        for _ in range(int(self.rng.integers(self.cfg.subagent_turns[0], self.cfg.subagent_turns[1] + 1))):
            yield from self._tool_turn(sub)
        key = [Vocab.key(self.task.key)] if sub.knows_key else []
        parent.ids += [tk.RESULT, *_body(sub.last)[: self.cfg.call_tokens], *key]
        parent.knows_key |= sub.knows_key

    def _tool(self, agent: str) -> Tool:
        seconds = float(self.cfg.tool_time_median_s * np.exp(self.cfg.tool_time_sigma * self.rng.standard_normal()))
        return Tool(seconds, bool(self.rng.random() < self.cfg.tool_failure_prob), agent)

    def _tool_output(self, failed: bool) -> list[int]:
        if failed:
            return [tk.TOOL, tk.ERR]
        lo, hi = self.cfg.tool_output_tokens
        return [tk.TOOL, *self.vocab.content(self.rng, int(self.rng.integers(lo, hi + 1))), Vocab.key(self.task.key)]

    # -------------------------------------------------------------------------------------- outcomes
    def _graded(self, output: Sequence[int], n: int, status: RunStatus, t_end: float, detail: str) -> Outcome:
        if self.eval_fails:
            return Outcome(self.run_id, self.query_id, RunStatus.EVAL_FAILURE, None, t_end,
                           "injected evaluation failure (agent.eval_failure_rate)")
        score = tk.verify(output, self.task.key, self.cfg.key_classes, n)
        return Outcome(self.run_id, self.query_id, status, score, t_end, detail)

    def outcome(self, t_end: float) -> Outcome:
        """The outcome of a run whose ``actions()`` finished."""
        if self.answer is None:
            raise RuntimeError(f"run {self.run_id} has not answered yet; use timeout_outcome or aborted_outcome")
        return self._graded(self.answer, self.cfg.answer_tokens, RunStatus.SCORED, t_end, "")

    def timeout_outcome(self, t_end: float) -> Outcome:
        """The outcome of a run stopped by its timeout: its last draft graded, or unscorable."""
        if self.cfg.partial_scoring and self.drafts:
            output, n = self.drafts[-1]
            return self._graded(output, n, RunStatus.TIMEOUT_PARTIAL, t_end,
                                f"timeout after {self.cfg.timeout_s:g} s; graded draft {len(self.drafts)}")
        why = "no draft yet" if self.cfg.partial_scoring else "agent.partial_scoring is false"
        return Outcome(self.run_id, self.query_id, RunStatus.TIMEOUT_UNSCORABLE, None, t_end,
                       f"timeout after {self.cfg.timeout_s:g} s; {why}")

    def aborted_outcome(self, t_end: float, detail: str) -> Outcome:
        """The outcome of a run the system could not continue (engine unreachable, aborts exhausted)."""
        return Outcome(self.run_id, self.query_id, RunStatus.ABORTED, None, t_end, detail)
