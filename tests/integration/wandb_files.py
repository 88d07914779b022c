"""Read an offline W&B run file (``RUN_DIR/wandb/offline-run-*/run-ID.wandb``) back with wandb's own record schema.

wandb 0.31 dropped its Python reader (``wandb.sdk.internal.datastore``; the writer is wandb-core, in Go), so the
framing is read here exactly as that module did: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then
LevelDB-log blocks of 32 KiB, each chunk ``crc32c(4) length(2, little-endian) type(1: full, 2 first, 3 middle,
4 last)``; every record is a ``wandb.proto.wandb_internal_pb2.Record``."""
import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7


def records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    pos, buf = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec
            buf = b""


def read_run(path: Path) -> dict:
    """{"run_id", "group", "config": {key: value}, "history": [{key: value}], "summary": {key: value}}"""
    out = {"run_id": None, "group": None, "config": {}, "history": [], "summary": {}}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["run_id"], out["group"] = r.run.run_id, r.run.run_group
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            out["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.summary.update})
    return out
