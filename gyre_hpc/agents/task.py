"""The task of the synthetic agent workload: its tokens, its hidden key, and the deterministic verifier.

Token layout (ids below ``vocab_size``; the control markers and headers are fixed, content is the rest)::

    0..15    markers     PAD SYS TASK CALL TOOL ERR SUMMARY SUB RESULT ANSWER END (11..15 unused)
    16..47   headers     CTX_i = 16 + (i mod 32): the token after the system prompt names the context
    48..63   keys        KEY_r = 48 + r, r < key_classes: what a successful tool reveals
    64..     content     everything the task, the tools and (ideally) the model write

A query (task) is ``task_tokens`` content tokens; its key is ``sum(task tokens) mod key_classes`` — derived from the
task, but a model cannot be expected to compute it: the tool reveals it as ``KEY_r``. An answer token ``t`` is
*right* iff it is a content token and ``(t - 64) mod key_classes == key``. The score of an output with room for
``n`` tokens (its ``max_new_tokens``) is ``right tokens among its first n / n``: dense (every token counts),
partial (any fraction), and not gamed by stopping early (missing tokens count as wrong). A trailing ``END`` is the
stop token, not an answer token. Chance level for a uniform policy is about ``(1 - 64/V) / key_classes``.

Invariants
- ``verify`` is a pure function of (output tokens, key, key_classes, n): same input, same score, in [0, 1].
- ``make_task`` and ``system_prompt`` are pure functions of (config, vocab, seed, index): the same query is the
  same tokens in every process, so all runs of a group see the same task.
- Every token the workload writes is below ``vocab_size``; the layout refuses a vocabulary without content room.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gyre_hpc.config import AgentConfig
from gyre_hpc.errors import ConfigError

PAD, SYS, TASK, CALL, TOOL, ERR, SUMMARY, SUB, RESULT, ANSWER, END = range(11)
MARKER_NAMES = ("PAD", "SYS", "TASK", "CALL", "TOOL", "ERR", "SUMMARY", "SUB", "RESULT", "ANSWER", "END")
CTX_BASE, N_CTX = 16, 32
KEY_BASE, N_KEYS = 48, 16
CONTENT = 64
MIN_CONTENT = 32  # content tokens a vocabulary must leave (task, tools and answers are drawn from them)

#: Seed streams: tasks and runs draw from disjoint generators for the same seed.
TASK_STREAM, SYSTEM_STREAM, RUN_STREAM = 1, 2, 3


@dataclass(frozen=True)
class Vocab:
    """The token layout for a model vocabulary of ``size`` ids."""

    size: int

    def __post_init__(self) -> None:
        if self.size < CONTENT + MIN_CONTENT:
            raise ConfigError(f"model.vocab_size: the agent workload needs >= {CONTENT + MIN_CONTENT} tokens "
                              f"({CONTENT} control ids + {MIN_CONTENT} content ids), got {self.size}")

    @property
    def n_content(self) -> int:
        return self.size - CONTENT

    @staticmethod
    def ctx(i: int) -> int:
        return CTX_BASE + i % N_CTX

    @staticmethod
    def key(r: int) -> int:
        return KEY_BASE + r

    def content(self, rng: np.random.Generator, n: int) -> list[int]:
        return (CONTENT + rng.integers(0, self.n_content, n)).tolist()

    def name(self, t: int) -> str:
        """Readable name of a token (docs, debugging): ``CALL``, ``CTX3``, ``KEY1``, or the id."""
        if t < len(MARKER_NAMES):
            return MARKER_NAMES[t]
        if CTX_BASE <= t < CTX_BASE + N_CTX:
            return f"CTX{t - CTX_BASE}"
        if KEY_BASE <= t < KEY_BASE + N_KEYS:
            return f"KEY{t - KEY_BASE}"
        return str(t)


@dataclass(frozen=True)
class Task:
    """One query: its content tokens, hidden key and number of tool-call turns."""

    index: int
    tokens: tuple[int, ...]
    key: int
    turns: int

    @property
    def query_id(self) -> str:
        return f"q{self.index}"


def system_prompt(cfg: AgentConfig, vocab: Vocab, seed: int) -> tuple[int, ...]:
    """``SYS`` and ``system_tokens - 1`` content tokens, fixed for a seed."""
    rng = np.random.default_rng([seed, SYSTEM_STREAM])
    return (SYS, *vocab.content(rng, cfg.system_tokens - 1))


def make_task(cfg: AgentConfig, vocab: Vocab, seed: int, index: int) -> Task:
    """Query ``index`` of the workload of ``seed``."""
    rng = np.random.default_rng([seed, TASK_STREAM, index])
    tokens = tuple(vocab.content(rng, cfg.task_tokens))
    turns = int(rng.integers(cfg.turns[0], cfg.turns[1] + 1))
    return Task(index, tokens, task_key(tokens, cfg.key_classes), turns)


def task_key(tokens: Sequence[int], key_classes: int) -> int:
    return int(sum(tokens)) % key_classes


def is_right(tokens: Sequence[int] | np.ndarray, key: int, key_classes: int) -> np.ndarray:
    """Per token: a content token of the key's residue class."""
    t = np.asarray(tokens, np.int64)
    return (t >= CONTENT) & ((t - CONTENT) % key_classes == key)


def verify(output: Sequence[int], key: int, key_classes: int, n: int) -> float:
    """Score of an output with room for ``n`` tokens: right tokens among its first ``n`` (a trailing END is the
    stop token), divided by ``n``."""
    out = list(output)
    if out and out[-1] == END:
        out.pop()
    return float(is_right(out[:n], key, key_classes).sum()) / n
