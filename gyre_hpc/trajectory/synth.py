"""Synthetic branching TITO logs for tests and benchmarks (deterministic for a seed).

One run is a main agent loop. Each turn the main agent makes a call (input = its context, output = generated
tokens), then a tool answers (tool tokens are appended). Before a turn (after the first) at most one event::

    compression  the harness replaces the context by S Z (system prompt + summary): a new context
    subagent     a subagent runs in a separate context S Q' (or S' Q' with its own system prompt) for a few
                 calls; its result comes back to the main context as tool output, then the main agent resumes
and after a main call, with ``retry_prob``, a retry re-sends the input of an earlier call of the current
context (which one: ``shared_prefix_frac`` of the way through its calls, 1.0 = the latest) and generates a
different output; the agent continues from the retry.

The synthetic logs are unambiguous for ``branches.classify``: the token after S is distinct for every context
of a run, a retry's first output token differs from the original's, tool output is never empty, and the final
call of a run is always a main-agent call (so a subagent's parent always resumes).

Outcomes: ``timeout_rate`` runs time out (fewer turns; ``partial_rate`` of them get a partial score, the others
are unscorable), ``eval_failure_rate`` runs have a crashed grader, ``aborted_rate`` are aborted; the rest are
scored with ``k / score_levels`` (0 included). Output tokens carry versions ``version`` or ``version + 1``
(a call can switch version mid-output with ``version_change_prob``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gyre_hpc.errors import TrajectoryError
from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, TitoLog


@dataclass
class _Run:
    rng: np.random.Generator
    run_id: str
    query_id: str
    k: dict
    calls: list[Call] = field(default_factory=list)
    kinds: dict = field(default_factory=dict)  # call id → the branch kind the generator meant
    heads: set = field(default_factory=set)  # tokens that follow the system prompt in this run's contexts
    t: float = 0.0

    def tokens(self, bounds: tuple[int, int]) -> np.ndarray:
        n = int(self.rng.integers(bounds[0], bounds[1] + 1))
        return self.rng.integers(0, self.k["vocab_size"], n, dtype=np.int64)

    def head(self, length: int, avoid: int | None = None) -> np.ndarray:
        """A task/summary opening whose first token starts no other context of this run."""
        first = int(self.rng.integers(0, self.k["vocab_size"]))
        while first in self.heads or first == avoid:
            first = (first + 1) % self.k["vocab_size"]
        self.heads.add(first)
        return np.concatenate([[first], self.tokens((length - 1, length - 1))]).astype(np.int64)

    def call(self, inp: np.ndarray, kind: str, avoid_first: int | None = None, finish: str = "stop") -> np.ndarray:
        out = self.tokens(self.k["output_len"])
        if avoid_first is not None and out[0] == avoid_first:
            out[0] = (out[0] + 1) % self.k["vocab_size"]
        versions = np.full(len(out), self.k["version"], np.int64)
        if len(out) > 1 and self.rng.random() < self.k["version_change_prob"]:
            versions[int(self.rng.integers(1, len(out))):] += 1
        lp = -self.rng.exponential(1.0, len(out))
        t0, self.t = self.t, self.t + 0.5 + float(self.rng.random())
        engine = f"engine-{int(self.rng.integers(0, 2))}"
        self.kinds[f"c{len(self.calls)}"] = "root" if not self.calls else kind
        self.calls.append(Call(self.run_id, self.query_id, f"c{len(self.calls)}", inp, out, lp, versions, engine,
                               finish, t0, self.t))
        return out


def _subagent(run: _Run, system: np.ndarray) -> np.ndarray:
    """Run a subagent; return its result as the tool output the main agent receives."""
    k = run.k
    if run.rng.random() < k["separate_system_prob"]:
        system = run.head(len(system), avoid=int(system[0]))
    ctx = np.concatenate([system, run.head(k["task_len"])])
    for turn in range(int(run.rng.integers(k["subagent_turns"][0], k["subagent_turns"][1] + 1))):
        if turn:
            ctx = np.concatenate([ctx, run.tokens(k["tool_len"])])
        ctx = np.concatenate([ctx, run.call(ctx, "continuation" if turn else "subagent")])
    return run.tokens(k["tool_len"])


def _main_loop(run: _Run, system: np.ndarray, task: np.ndarray, n_turns: int, timed_out: bool) -> None:
    k, rng = run.k, run.rng
    ctx = np.concatenate([system, task])
    ctx_calls: list[tuple[np.ndarray, np.ndarray]] = []  # (input, output) of the current context's calls
    tool = np.zeros(0, np.int64)
    for turn in range(n_turns):
        event, kind = rng.random(), "continuation"
        if turn and event < k["compression_prob"]:
            ctx, ctx_calls, kind = np.concatenate([system, run.head(k["task_len"])]), [], "compression"
        elif turn and event < k["compression_prob"] + k["subagent_prob"]:
            ctx = np.concatenate([ctx, _subagent(run, system)])
        else:
            ctx = np.concatenate([ctx, tool])
        last = turn == n_turns - 1
        out = run.call(ctx, kind, finish="length" if (last and timed_out) else "stop")
        ctx_calls.append((ctx, out))
        ctx = np.concatenate([ctx, out])
        if not last and rng.random() < k["retry_prob"]:
            inp, orig = ctx_calls[int(round(k["shared_prefix_frac"] * (len(ctx_calls) - 1)))]
            out = run.call(inp, "retry", avoid_first=int(orig[0]) if len(orig) else None)
            ctx_calls.append((inp, out))
            ctx = np.concatenate([inp, out])
        tool = run.tokens(k["tool_len"])


def _outcome(run: _Run, timed_out: bool) -> Outcome:
    k, rng = run.k, run.rng
    score = float(rng.integers(0, k["score_levels"] + 1)) / k["score_levels"]
    if timed_out:
        partial = rng.random() < k["partial_rate"]
        status = RunStatus.TIMEOUT_PARTIAL if partial else RunStatus.TIMEOUT_UNSCORABLE
        score = score if partial else None
    else:
        u = rng.random()
        status = (RunStatus.EVAL_FAILURE if u < k["eval_failure_rate"] else
                  RunStatus.ABORTED if u < k["eval_failure_rate"] + k["aborted_rate"] else RunStatus.SCORED)
        score = score if status is RunStatus.SCORED else None
    return Outcome(run.run_id, run.query_id, status, score, run.t + 1.0)


DEFAULTS = dict(vocab_size=256, system_len=8, task_len=8, turns=(2, 5), output_len=(4, 16), tool_len=(2, 8),
                retry_prob=0.15, compression_prob=0.1, subagent_prob=0.1, subagent_turns=(1, 3),
                separate_system_prob=0.3, shared_prefix_frac=1.0, timeout_rate=0.1, partial_rate=0.5,
                eval_failure_rate=0.05, aborted_rate=0.0, score_levels=10, version=0, version_change_prob=0.1)

KNOB_DOCS = dict(
    vocab_size="token ids are drawn from [0, vocab_size)", system_len="system prompt tokens (shared by all runs)",
    task_len="task tokens per query (and per summary / subagent task)", turns="main-agent turns per run",
    output_len="generated tokens per call", tool_len="tool-output tokens after each call",
    retry_prob="after a main call: chance of a retry", compression_prob="before a turn: chance of a compression",
    subagent_prob="before a turn: chance of a subagent", subagent_turns="calls per subagent",
    separate_system_prob="chance a subagent has its own system prompt (shares nothing)",
    shared_prefix_frac="which earlier call a retry re-sends: 0 = the context's first, 1 = the latest",
    timeout_rate="runs that time out (fewer turns)", partial_rate="timed-out runs whose partial work is scored",
    eval_failure_rate="finished runs whose grader fails", aborted_rate="finished runs that are aborted",
    score_levels="scores are k / score_levels", version="policy version of the outputs",
    version_change_prob="chance a call's output switches to version + 1 midway")


class SynthKnobError(TrajectoryError, ValueError):
    """A knob of ``synth_log`` out of range (the message names the knob and its command-line flag)."""


def _check(n_queries: int, runs_per_query: int, k: dict) -> None:
    def bad(name: str, rule: str, value) -> SynthKnobError:
        flag = {"n_queries": "queries", "runs_per_query": "runs"}.get(name, name).replace("_", "-")
        return SynthKnobError(f"synth_log: {name} (--{flag}) must be {rule}, got {value!r}")

    lows = {"n_queries": (n_queries, 1), "runs_per_query": (runs_per_query, 1), "system_len": (k["system_len"], 1),
            "task_len": (k["task_len"], 1), "vocab_size": (k["vocab_size"], 16), "score_levels": (k["score_levels"], 1),
            "version": (k["version"], 0)}
    for name, (value, low) in lows.items():
        if value < low:
            why = " (distinct context openings need room)" if name == "vocab_size" else ""
            raise bad(name, f">= {low}{why}", value)
    for name in ("turns", "output_len", "tool_len", "subagent_turns"):
        lo, hi = k[name]
        if not 1 <= lo <= hi:
            raise bad(name, "MIN MAX with 1 <= MIN <= MAX", (lo, hi))
    for name, value in k.items():
        if name.endswith(("_prob", "_rate", "_frac")) and not 0.0 <= value <= 1.0:
            raise bad(name, "in [0, 1]", value)


def synth_log(n_queries: int, runs_per_query: int, *, seed: int, **knobs) -> TitoLog:
    """A branching TITO log; knobs (see ``DEFAULTS``) control sizes, branch and outcome rates."""
    return synth_with_kinds(n_queries, runs_per_query, seed=seed, **knobs)[0]


def synth_with_kinds(n_queries: int, runs_per_query: int, *, seed: int,
                     **knobs) -> tuple[TitoLog, dict[tuple[str, str], str]]:
    """``synth_log`` and the branch kind the generator meant for each (run id, call id)."""
    unknown = sorted(set(knobs) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"synth_log: unknown knob(s) {', '.join(unknown)}; valid: {', '.join(DEFAULTS)}")
    k = {**DEFAULTS, **knobs}
    _check(n_queries, runs_per_query, k)
    rng = np.random.default_rng(seed)
    system = rng.integers(0, k["vocab_size"], k["system_len"], dtype=np.int64)
    calls, outcomes, kinds = [], [], {}
    for q in range(n_queries):
        task = rng.integers(0, k["vocab_size"], k["task_len"], dtype=np.int64)
        for r in range(runs_per_query):
            run = _Run(np.random.default_rng([seed, q, r]), f"q{q}-r{r}", f"q{q}", k, heads={int(task[0])})
            n_turns = int(run.rng.integers(k["turns"][0], k["turns"][1] + 1))
            timed_out = run.rng.random() < k["timeout_rate"]
            if timed_out:
                n_turns = int(run.rng.integers(1, n_turns + 1))
            _main_loop(run, system, task, n_turns, timed_out)
            calls += run.calls
            kinds.update({(run.run_id, c): kind for c, kind in run.kinds.items()})
            outcomes.append(_outcome(run, timed_out))
    return TitoLog(tuple(calls), tuple(outcomes), f"<synth seed={seed}>"), kinds
