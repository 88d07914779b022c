"""The local engine's KV port: stages exported KV bundles in a registered Mooncake buffer and pulls peers' bundles
with ONE batched transfer (``batch_transfer_sync_read``), the way the proxy's KV mover moves a run between engines.

    source  /kv/export {tokens}  → stage(bundle): copy into a registered buffer → {move_id, location, address, ...}
    target  /kv/import {desc}    → pull(desc): one batch read of desc.nbytes in transfer.chunk_bytes pieces
    source  /kv/release {move_id} → the staged buffer is unregistered and freed

Invariants
- The Mooncake engine starts on first use, in the engine process (after any fork), on ``transfer.host``.
- Mooncake reports failures as ``-1``; a failed read is retried ``PULL_RETRIES`` times into a fresh buffer, then
  becomes a ``TransferError``; the destination buffer of every failed read is quarantined (a timed-out read may
  still land) and never reused.
- At most ``MAX_STAGED`` bundles are staged; staging one more drops the oldest (its mover has long given up).
"""
from __future__ import annotations

import collections
import itertools

import numpy as np

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import TransferConfig
from gyre_hpc.localengine.kvexport import KVBundle
from gyre_hpc.localengine.kvprefix import describe
from gyre_hpc.errors import TransferError

MAX_STAGED = 16
# A source's Mooncake engine starts at its first export and binds its handshake port a moment later: a first read
# was refused ("SocketHandShakePlugin: connect() ... Connection refused") in live runs, the retry then succeeds.
PULL_RETRIES = 1
RETRY_AFTER_S = 0.5


class KVPort:
    def __init__(self, cfg: TransferConfig, clock: Clock | None = None):
        self.cfg = cfg
        self.clock = clock or WallClock()  # the wait before a failed read is retried
        self._engine = None
        self._location = ""
        self._staged: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self._pull = None  # _Registered destination buffer
        self._ids = itertools.count()

    def _start(self):
        if self._engine is None:
            from gyre_hpc.transfer.mooncake import _Registered, start_engine

            self._engine = start_engine(self.cfg)
            self._location = f"{self.cfg.host}:{self._engine.get_rpc_port()}"
            self._pull = _Registered(self._engine, "KV import", keep_previous=False)
        return self._engine

    def stage(self, bundle: KVBundle) -> dict:
        engine = self._start()
        buf = np.empty(max(bundle.nbytes, 1), dtype=np.uint8)
        buf[:bundle.nbytes] = bundle.data
        if engine.register_memory(int(buf.ctypes.data), len(buf)) != 0:
            raise TransferError(f"Mooncake could not register a {len(buf)}-byte KV staging buffer")
        move_id = f"kv{next(self._ids)}"
        self._staged[move_id] = buf
        while len(self._staged) > MAX_STAGED:
            self.release(next(iter(self._staged)))
        return {"move_id": move_id, "location": self._location, "address": int(buf.ctypes.data), **describe(bundle)}

    def release(self, move_id: str) -> bool:
        buf = self._staged.pop(move_id, None)
        if buf is None:
            return False
        self._engine.unregister_memory(int(buf.ctypes.data))
        return True

    def pull(self, desc: dict) -> np.ndarray:
        """The bytes of a peer's staged bundle (one batched read); a copy the caller owns."""
        engine = self._start()
        n = int(desc["nbytes"])
        step = self.cfg.chunk_bytes
        offs = list(range(0, n, step))
        for attempt in range(1 + PULL_RETRIES):
            dst = self._pull.reserve(n)
            local, remote = int(dst.ctypes.data), int(desc["address"])
            rc = engine.batch_transfer_sync_read(str(desc["location"]), [local + o for o in offs],
                                                 [remote + o for o in offs], [min(step, n - o) for o in offs])
            if rc == 0:
                return dst[:n].copy()
            self._pull.quarantine()  # a failed read may still land: never reuse that buffer
            self.clock.sleep(RETRY_AFTER_S)
        raise TransferError(f"KV transfer from {desc['location']} failed (rc {rc}; {n} bytes, {len(offs)} chunks, "
                            f"{1 + PULL_RETRIES} attempts; reason on stderr)")
