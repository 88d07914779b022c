"""Atomic outputs and run directories.

Invariant: a reader never sees a half-written file or checkpoint. Every output is written to a temporary
sibling and renamed into place (``os.replace`` is atomic on POSIX within one filesystem); a process killed
mid-write leaves at most a ``.tmp-*`` sibling, never a truncated target.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from gyre_hpc.errors import ConfigError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, with the permissions a plain ``open`` would give."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces ``path`` whole (an old ``path`` is removed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".old-{path.name}-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def make_run_dir(out_dir: str | Path, name: str) -> Path:
    """A fresh ``<out_dir>/<name>-<YYYYmmdd-HHMMSS>[-N]`` directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(out_dir) / f"{name}-{stamp}"
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        except OSError as exc:  # unwritable, read-only, full, a file in the way: one line, nothing written
            raise ConfigError(f"run.out_dir: cannot create the run directory {path} ({exc.strerror or exc}); "
                              f"choose a writable directory with --set run.out_dir=DIR") from None


def atomic_write_many(files: dict[str | Path, bytes]) -> list[Path]:
    """Write several files, none of them replaced unless every one was written in full: all go to temporary
    siblings first, then each is renamed into place (an error while writing leaves the old files and no temp)."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
            staged.append((tmp, path))
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    return [path for _, path in staged]
