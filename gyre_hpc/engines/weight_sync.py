"""Weights into a running engine over ``/update_weights_from_distributed``: the one road, for every engine kind.

Who sends which bytes, when (docs/weights.md)::

    cell rank (rank 0 of a 2-rank torch group)              engine (rank 1: the local engine or SGLang)
    -- once per engine process ---------------------------------------------------------------------------
    POST /init_weights_update_group {addr, port, 1, 2, name, backend}   ─▶  joins the group (blocks until we do)
    open_group(addr, port, rank 0)  (TCPStore master here)               ◀─  rendezvous
    -- every new version -----------------------------------------------------------------------------------
    POST /pause_generation {mode: in_place}    (running requests keep their KV and wait; SGLang would otherwise
                                                hold the update until every running request finished)
    POST /begin_weight_update
    POST /update_weights_from_distributed {names, dtypes, shapes, weight_version, flush_cache}  (in a thread)
    broadcast(t, group_src=0) for t in tensors, in ``names`` order  ─▶  receives into fresh tensors, loads them
    POST /update_weight_version {new_version, abort_all_requests: false}   (in-flight requests keep running)
    POST /end_weight_update
    POST /continue_generation                  (the held requests go on under the new weights and version)

Buckets (``push_stream``; ``gyre_hpc.train.reshard`` makes them from a TP/PP trainer's shards): the update and
broadcast lines repeat once per bucket, ``weight_version`` only on the last one, all inside the one paused update;
``push`` is the one-bucket case.

Names are Hugging Face names (``gyre_hpc.train.hf_weights.to_hf``) when the model maps to one (``hf_names``): what
SGLang needs, and what the local engine maps back. A model with no HF form (LayerNorm, GELU, learned positions)
travels under megatron's own names, which only the local engine accepts (SGLang cannot serve it anyway).

The group is built the way SGLang's ``init_custom_process_group`` builds it (a TCP rendezvous store wrapped in a
``PrefixStore(group_name, ...)``, an explicit ``timedelta`` timeout): a plain ``init_process_group`` does not meet it
(../shared/notes/sglang.md). Both sides here use ``open_group``.

Invariants
- An update is always closed: ``/end_weight_update`` follows every ``/begin_weight_update`` that succeeded, and
  ``/continue_generation`` every ``/pause_generation``.
- Never aborts: the version is tagged with ``abort_all_requests: false``; in-flight requests continue and their
  later tokens carry the new version (``meta_info.weight_versions`` spans).
- A failed attempt tears the group down on both sides (``/destroy_weights_update_group`` and locally) before the
  next one builds a fresh group; after ``1 + retries`` failed attempts the push raises ``WeightSyncError``.
- No disk: the bytes go from the sender's tensors to the engine's over the group only.
"""
from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Iterable, Mapping

import torch

from gyre_hpc.clock import Clock, WallClock, wait_until
from gyre_hpc.config import ModelConfig
from gyre_hpc.errors import EngineError, WeightSyncError  # noqa: F401 (WeightSyncError: re-exported)

GROUP_NAME = "gyre_weights"


def hf_names(cfg: ModelConfig) -> bool:
    """True when the model's tensors have Hugging Face names (Qwen2/Qwen3 layout: RoPE, RMSNorm, SwiGLU)."""
    from gyre_hpc.train.hf_weights import has_hf_form

    return has_hf_form(cfg)


def engine_tensors(full: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full megatron tensors (a trainer export or a pull) → the tensors to send, under the names engines load."""
    from gyre_hpc.train.hf_weights import to_hf

    full = {k: v for k, v in full.items() if isinstance(v, torch.Tensor)}
    return to_hf(full, cfg) if hf_names(cfg) else {k: v.contiguous() for k, v in full.items()}


def group_backend(device: str) -> str:
    """gloo for CPU engines, nccl for GPU ones (``engine.device``; auto: nccl when torch sees a GPU)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "nccl" if device == "cuda" else "gloo"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` → ``"float32"`` (SGLang resolves it with ``getattr(torch, name)``)."""
    return str(dtype).removeprefix("torch.")


def open_group(address: str, port: int, world_size: int, rank: int, group_name: str = GROUP_NAME,
               backend: str = "gloo", timeout_s: float = 60.0):
    """A torch process group of ``world_size`` ranks met at ``tcp://address:port`` (rank 0 hosts the store),
    built as SGLang's ``init_custom_process_group`` builds it; blocks until every rank joined."""
    from torch.distributed import distributed_c10d as c10d

    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(c10d.rendezvous(f"tcp://{address}:{port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    pg, _ = c10d._new_process_group_helper(world_size, rank, [], c10d.Backend(backend), store,
                                           group_name=group_name, backend_options=None, timeout=timeout)
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def close_group(pg) -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group(pg)
    except Exception:  # a group broken by a peer that died: nothing left to free
        pass


def receive(pg, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> dict[str, torch.Tensor]:
    """The receiving side: one broadcast from group rank 0 per tensor, in ``names`` order."""
    import torch.distributed as dist

    out, works = {}, []
    for name, dtype, shape in zip(names, dtypes, shapes):
        t = torch.empty(shape, dtype=getattr(torch, dtype))
        works.append(dist.broadcast(t, group_src=0, group=pg, async_op=True))
        out[name] = t
    for w in works:
        w.wait()
    return out


class _CallThread(threading.Thread):
    """One blocking HTTP call in a thread (the engine answers only once the collective it joins is done)."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self.fn, self.args, self.result, self.error = fn, args, None, None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except Exception as exc:  # handed to the caller by finish()
            self.error = exc

    def finish(self, timeout: float) -> Any:
        self.join(timeout)
        if self.is_alive():
            raise EngineError(f"no answer within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.result


def _quietly(fn) -> None:
    try:
        fn()
    except EngineError:
        pass


class WeightPusher:
    """Pushes versions into one engine (``client``: an ``EngineClient``) over a group it opens once."""

    def __init__(self, client, host: str = "127.0.0.1", backend: str = "gloo", retries: int = 2,
                 timeout_s: float = 60.0, group_name: str = GROUP_NAME, clock: Clock | None = None,
                 engine_ranks: int = 1):
        """``group_name``: unique among this process's pushers (one per engine replica); ``engine_ranks``: the
        engine's TP size (each of its ranks joins the group after ours: world size 1 + engine_ranks)."""
        self.client, self.host, self.backend, self.engine_ranks = client, host, backend, engine_ranks
        self.clock = clock or WallClock()  # push timings and the broadcasts' deadline
        self.retries, self.timeout_s, self.group_name = retries, timeout_s, group_name
        self.pg = None
        self.attempts: list[dict] = []  # failed attempts (version, error)

    def push(self, tensors: Mapping[str, torch.Tensor], version: str, flush_cache: bool = False) -> dict:
        """Send ``tensors`` (engine names) as ``version``; returns {seconds, bytes, gb_per_s, tensors, attempt}."""
        errors = []
        for attempt in range(1 + self.retries):
            try:
                stats = self._push_once(tensors, str(version), flush_cache)
                return {**stats, "attempt": attempt}
            except (EngineError, RuntimeError) as exc:  # RuntimeError: gloo (peer gone, timeout)
                errors.append(f"attempt {attempt}: {exc}")
                self.attempts.append({"version": str(version), "error": str(exc)[:300]})
                self.reset()
        raise WeightSyncError(f"{self.client.url}: weight version {version} not pushed after "
                              f"{1 + self.retries} attempts: " + " | ".join(errors), endpoint="/update_weights_from_distributed")

    def connect(self) -> None:
        """Build the group with the engine now (else the first ``push`` does)."""
        self._ensure_group()

    def _ensure_group(self) -> None:
        if self.pg is not None:
            return
        from gyre_hpc.engines.launch import free_port

        port = free_port()
        world = 1 + self.engine_ranks
        call = _CallThread(self.client.init_weights_update_group, self.host, port, 1, world, self.group_name, self.backend)
        try:
            pg = open_group(self.host, port, world, 0, self.group_name, self.backend, self.timeout_s)
        except Exception:
            call.join(self.timeout_s)
            if call.error is not None:
                raise call.error from None
            raise
        try:
            call.finish(self.timeout_s)
        except Exception:
            close_group(pg)
            raise
        self.pg = pg

    def _push_once(self, tensors: Mapping[str, torch.Tensor], version: str, flush_cache: bool) -> dict:
        return self.push_stream(iter([(tensors, True)]), version, flush_cache)

    def push_stream(self, buckets: Iterable[tuple[Mapping[str, torch.Tensor], bool]], version: str,
                    flush_cache: bool = False) -> dict:
        """One attempt (no retry; on error the caller ``reset``s): ``(tensors, last)`` buckets, each one
        ``/update_weights_from_distributed`` call and its broadcasts, all inside one paused update. Only the last
        bucket carries ``weight_version`` (an engine's version changes once every bucket is in). Returns
        {seconds, bytes, gb_per_s, tensors, buckets, max_bucket_bytes}."""
        self._ensure_group()
        t0 = self.clock.now()
        nbytes = ntensors = nbuckets = largest = 0
        self.client.pause("in_place")  # SGLang waits for running requests unless paused; in_place keeps them
        try:
            self.client.begin_weight_update()
            try:
                for tensors, last in buckets:
                    sent = self._send_bucket(tensors, version if last else None, flush_cache and last)
                    nbytes, ntensors, nbuckets = nbytes + sent[0], ntensors + sent[1], nbuckets + 1
                    largest = max(largest, sent[0])
                    del tensors
                self.client.update_weight_version(version, abort_all_requests=False)
            finally:
                _quietly(self.client.end_weight_update)  # the attempt's own error (if any) is the one to report
        finally:
            self.client.resume()  # the held requests go on; their next tokens carry the new version
        seconds = self.clock.now() - t0
        return {"seconds": seconds, "bytes": nbytes, "gb_per_s": nbytes / max(seconds, 1e-9) / 1e9,
                "tensors": ntensors, "buckets": nbuckets, "max_bucket_bytes": largest}

    def _send_bucket(self, tensors: Mapping[str, torch.Tensor], version: str | None,
                     flush_cache: bool) -> tuple[int, int]:
        """One update call and its broadcasts, waited for; returns (bytes, tensors)."""
        import torch.distributed as dist

        names = list(tensors)
        device = "cuda" if self.backend == "nccl" else "cpu"  # nccl moves GPU tensors only (untested here: no GPU)
        ts = [tensors[n].detach().to(device).contiguous() for n in names]
        call = _CallThread(self.client.update_weights_from_distributed, names, [dtype_name(t.dtype) for t in ts],
                     [list(t.shape) for t in ts], version, flush_cache, self.group_name)
        works = [dist.broadcast(t, group_src=0, group=self.pg, async_op=True) for t in ts]
        self._wait(works, call)
        call.finish(self.timeout_s)
        return sum(t.numel() * t.element_size() for t in ts), len(ts)

    def _wait(self, works: list, call: _CallThread) -> None:
        """Wait for the broadcasts; stop early when the engine refused the update (it will not receive)."""
        def received() -> bool:
            if not call.is_alive() and call.error is not None:
                raise call.error
            return all(w.is_completed() for w in works)

        if not wait_until(received, self.timeout_s, self.clock, poll_s=0.001):
            raise EngineError(f"broadcast not received within {self.timeout_s} s")
        for w in works:
            w.wait()

    def reset(self, remote: bool = True) -> None:
        """Tear the group down: the engine's side (unless ``remote`` is false: it is gone) and ours."""
        if self.pg is None:
            return
        if remote:
            try:
                self.client.destroy_weights_update_group(self.group_name)
            except EngineError:
                pass  # the engine may be gone, or never built its side
        close_group(self.pg)
        self.pg = None

    def close(self) -> None:
        self.reset()
