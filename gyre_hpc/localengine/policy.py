"""The policy an engine generates from: the trainer's own megatron-core ``GPTModel``, run for next-token logits.

The local engine talks to a ``EngineModel`` only (``next_token_logits``, ``load_weights``, ``checksum``), so another
backend plugs in without touching the scheduler. ``MegatronPolicy`` builds the model with
``gyre_hpc.train.model.build_model`` (same config, same seed → the trainer's initial weights), so a trainer export
loads with no conversion.

Batching without a KV cache (a deliberate choice for tiny CPU models, documented in docs/engines.md): every call
runs one forward over all sequences, right-padded to the longest, under a causal mask. Right padding is
harmless: with a causal mask no real token attends a later pad, and positions are 0..len-1 for every
sequence, so a sequence's logits do not depend on what it is batched with (up to float rounding).

Invariants
- ``next_token_logits(seqs)[i]`` is the model's logit row at the last token of ``seqs[i]`` (equal, up to float
  rounding, to running ``seqs[i]`` alone).
- ``load_weights`` accepts exactly the model's tensor names with their shapes and dtypes; anything else is an
  ``EngineError`` (400) and leaves the loaded weights untouched.
- ``checksum()`` equals ``weights_checksum`` of the loaded tensors (hence of the trainer export they came from).
- ``release_weights()`` frees every weight tensor (shapes and dtypes kept); ``allocate_weights()`` gives them
  storage again, with undefined values, ready for ``load_weights``; ``initial_state()`` is the seed's weights.
"""
from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np
import torch

from gyre_hpc.config import ModelConfig
from gyre_hpc.engines.weights import weights_checksum
from gyre_hpc.errors import EngineError


class EngineModel(Protocol):
    vocab_size: int

    def next_token_logits(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """Logits ``[len(seqs), vocab]`` (float32) of the token after each sequence."""

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Replace the weights (same names and shapes), in place."""

    def checksum(self) -> str:
        """A hex digest of the loaded weights."""

    def release_weights(self) -> None:
        """Free the weights' memory (the engine sleeps)."""

    def allocate_weights(self) -> None:
        """Give the released weights storage again (values undefined until ``load_weights``)."""

    def initial_state(self) -> Mapping[str, torch.Tensor]:
        """The weights the policy was built with (config + seed)."""


class MegatronPolicy:
    """A single-process megatron ``GPTModel`` (TP=1) in eval mode."""

    def __init__(self, model_cfg: ModelConfig, seed: int = 0, threads: int | None = None):
        from gyre_hpc.train.model import build_model, forward_logits

        if threads is not None:
            torch.set_num_threads(threads)
        self.vocab_size = model_cfg.vocab_size
        self.max_seq_len = model_cfg.max_seq_len
        self._forward = forward_logits
        self._build = lambda: build_model(model_cfg, seed=seed)
        self.model = self._build().eval()
        self._device = next(self.model.parameters()).device
        self._checksum: str | None = None
        self._released: dict[str, tuple[int, ...]] = {}  # name -> shape of the weights freed by release_weights

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.model.state_dict().items() if isinstance(v, torch.Tensor)}

    @torch.inference_mode()
    def next_token_logits(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        lengths = torch.tensor([len(s) for s in seqs])
        b, s = len(seqs), int(lengths.max())
        ids = torch.zeros(b, s, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        pos = torch.arange(s).unsqueeze(0).expand(b, s)
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).view(1, 1, s, s)
        d = self._device
        logits = self._forward(self.model, ids.to(d), pos.to(d), mask.to(d))  # [b, s, V]
        last = logits[torch.arange(b, device=d), (lengths - 1).to(d)]
        return last[:, : self.vocab_size].float().cpu().numpy()

    def paged(self, block_size: int, pool_tokens: int, prefill_chunk: int = 1024):
        """A ``PagedDecoder`` over this model's live parameters (weight loads are seen by it)."""
        from gyre_hpc.localengine.paged import PagedDecoder

        return PagedDecoder(self.model, self.vocab_size, block_size, pool_tokens, prefill_chunk)

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        own = self.state()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise EngineError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}",
                              status=400)
        for name, t in own.items():
            if tuple(state[name].shape) != tuple(t.shape) or state[name].dtype != t.dtype:
                raise EngineError(f"weights do not fit the model: {name} is {state[name].dtype} "
                                  f"{list(state[name].shape)}, the model has {t.dtype} {list(t.shape)}", status=400)
        with torch.no_grad():
            for name, t in own.items():
                t.copy_(state[name])
        self._checksum = None

    def _live_tensors(self) -> dict[str, torch.Tensor]:
        """The module's own parameters and buffers under their state-dict names (not detached copies)."""
        own = {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}
        return {name: own[name] for name in self.state() if name in own}

    def release_weights(self) -> None:
        tensors = self._live_tensors()
        self._released = {name: tuple(t.shape) for name, t in tensors.items()}
        with torch.no_grad():
            for t in tensors.values():
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        self._checksum = None

    def allocate_weights(self) -> None:
        with torch.no_grad():
            for name, t in self._live_tensors().items():
                if name in self._released:
                    t.data = torch.empty(self._released[name], dtype=t.dtype, device=t.device)
        self._released = {}

    def initial_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self._build().state_dict().items() if isinstance(v, torch.Tensor)}

    def checksum(self) -> str:
        if self._checksum is None:
            self._checksum = weights_checksum(self.state())
        return self._checksum
