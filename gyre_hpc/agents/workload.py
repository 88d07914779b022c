"""A seeded workload of agent groups, the engine-facing sampling params, and ``play`` in virtual time (pure).

``Workload(cfg, vocab_size, seed)`` names every query by index: ``group(i)`` is the ``runs_per_group`` episodes
of query ``i`` (run ids ``q<i>-r<j>``). A driver runs each episode; the live one is ``harness.Harness``, and
``play`` here runs one with a model function and a virtual clock (tests, docs, what-ifs)::

    t:  0 ──gen── 0.2 ──tool 0.05── 0.25 ──gen── ... ── timeout_s
        every Generate costs s_per_call + s_per_token * output tokens; every Tool its seconds; a step that
        would end past the timeout is not taken (its call is not recorded) and the run times out.

Invariants
- ``sampling_params`` are valid SGLang ``sampling_params``: ``max_new_tokens`` of the call, the configured
  temperature/top-p/top-k, ``stop_token_ids=[END]`` and, when ``seeded_sampling``, a ``sampling_seed`` that is a
  function of (seed, run id, call id) only.
- ``play`` returns the calls in the order they finished and exactly one outcome; with the same model outputs it
  returns the same calls and outcome.
"""
from __future__ import annotations

import zlib
from typing import Callable, Sequence

import numpy as np

from gyre_hpc.agents import task as tk
from gyre_hpc.agents.env import Episode, Generate, Tool
from gyre_hpc.agents.task import Task, Vocab
from gyre_hpc.config import AgentConfig
from gyre_hpc.trajectory.records import Call, Outcome

Model = Callable[[Generate], Sequence[int]]


class Workload:
    """The queries of one seed and the runs of each query."""

    def __init__(self, cfg: AgentConfig, vocab_size: int, seed: int):
        self.cfg, self.seed = cfg, seed
        self.vocab = Vocab(vocab_size)
        self.system = tk.system_prompt(cfg, self.vocab, seed)

    def task(self, index: int) -> Task:
        return tk.make_task(self.cfg, self.vocab, self.seed, index)

    def group(self, index: int) -> list[Episode]:
        """The ``runs_per_group`` runs of query ``index`` (fresh episodes: each can be driven once)."""
        task = self.task(index)
        return [Episode(self.cfg, self.vocab, self.system, task, j, self.seed) for j in range(self.cfg.runs_per_group)]

    def sampling_params(self, max_new_tokens: int, run_id: str, call_id: str) -> dict:
        cfg = self.cfg
        params = {"max_new_tokens": max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p,
                  "top_k": cfg.top_k, "stop_token_ids": [tk.END]}
        if cfg.seeded_sampling:
            params["sampling_seed"] = zlib.crc32(f"{self.seed}/{run_id}/{call_id}".encode()) & 0x7FFFFFFF
        return params


def random_model(vocab: Vocab, seed: int, stop_prob: float = 0.0) -> Model:
    """A uniform policy over the vocabulary (what a randomly initialised model roughly is); each output has its
    full ``max_new_tokens`` unless it draws END early with ``stop_prob`` per token."""
    rng = np.random.default_rng(seed)

    def model(action: Generate) -> list[int]:
        out = rng.integers(0, vocab.size, action.max_new_tokens).tolist()
        stops = np.flatnonzero(rng.random(action.max_new_tokens) < stop_prob)
        return out[: stops[0]] + [tk.END] if stops.size else out

    return model


def play(episode: Episode, model: Model, s_per_call: float = 0.0, s_per_token: float = 0.0,
         engine: str = "virtual") -> tuple[list[Call], Outcome]:
    """Drive ``episode`` with ``model`` in virtual time (from 0) under ``agent.timeout_s``."""
    deadline = episode.cfg.timeout_s
    t, calls, reply = 0.0, [], None
    actions = episode.actions()
    while True:
        try:
            action = actions.send(reply)
        except StopIteration:
            return calls, episode.outcome(t)
        if isinstance(action, Tool):
            cost, reply = action.seconds, None
        else:
            reply = list(model(action))
            cost = s_per_call + s_per_token * len(reply)
        if t + cost > deadline:
            return calls, episode.timeout_outcome(deadline)
        if isinstance(action, Generate):
            calls.append(Call.of(episode.run_id, action.call_id, action.input_ids, reply, query_id=episode.query_id,
                                 engine=engine, finish_reason=_finish(reply, action.max_new_tokens),
                                 t_start=t, t_end=t + cost))
        t += cost


def _finish(output: Sequence[int], max_new: int) -> str:
    return "stop" if output and output[-1] == tk.END else "length" if len(output) >= max_new else "stop"
