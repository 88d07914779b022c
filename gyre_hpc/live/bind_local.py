"""The bind shim at the edge: build ``gyre_hpc/native/bind_local.c`` once, and the environment that loads it.

::

    library()               cc -shared -fPIC -O2 bind_local.c -ldl -> CACHE/gyre_hpc/bind_local-<arch>-<hash>.so
    preload_env(env, "lo")  {GYRE_LISTEN_INTERFACE: lo, LD_PRELOAD: <library>[:<LD_PRELOAD>]}
    python -m gyre_hpc.live.bind_local      prints the library's path (building it), for batch scripts

What the shim does (bind_local.c's header): wildcard binds (0.0.0.0, ::) of TCP/UDP sockets move to the
interface's address, read in each process with getifaddrs; everything else passes through.

Invariants (tests/unit/test_bind_local.py)
- The library's file name carries the source's hash (and the machine's architecture): a changed source is
  rebuilt, an unchanged one is built at most once per cache; it appears whole (temporary file, then rename), so a
  process never loads a half-written library, also when several build at once.
- No C compiler, or a failed build: one line on stderr (``gyre: ...``), ``library()`` returns None and
  ``preload_env`` adds nothing: the run goes on with wildcard listeners, never a crash.
- A library (or cache directory) that another user owns or that group or others can write is never loaded (every
  process of the job would run its code): a warning, and no shim.
- ``preload_env`` keeps an existing ``LD_PRELOAD`` (after the shim) and adds nothing for interface ``""``.
- Standard library only.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping

from gyre_hpc.errors import ConfigError
from gyre_hpc.launcher.listen import ENV

SOURCE = Path(__file__).resolve().parents[1] / "native" / "bind_local.c"
#: environment variable naming the C compiler (the usual one); ``cc`` when unset
CC_ENV = "CC"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/gyre_hpc`` (default ``~/.cache/gyre_hpc``): one per user, shared by a cluster's nodes
    wherever home is."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gyre_hpc"


def library_path(cache: Path | None = None) -> Path:
    """Where the library built from today's source lives (built or not)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return (cache or cache_dir()) / f"bind_local-{platform.machine() or 'unknown'}-{digest}.so"


def warn(message: str) -> None:
    print(f"gyre: {message}; listeners stay on wildcard addresses (docs/reliability.md)", file=sys.stderr,
          flush=True)


def library(cache: Path | None = None, compiler: str | None = None) -> Path | None:
    """The built library (compiled now if this source was never built here), or None after a one-line warning."""
    try:
        target = library_path(cache)
    except RuntimeError as exc:  # Path.home(): no HOME and no passwd entry
        warn(f"no cache directory for the shim ({exc}; set XDG_CACHE_HOME)")
        return None
    if any(c in str(target) for c in " ,:"):  # LD_PRELOAD splits on spaces and colons, srun's --export on commas
        warn(f"the library's path {target} has a space, comma or colon (set XDG_CACHE_HOME)")
        return None
    if target.is_file():
        return _trusted(target)
    cc = shutil.which(compiler or os.environ.get(CC_ENV) or "cc")
    if cc is None:
        warn(f"no C compiler ({compiler or os.environ.get(CC_ENV) or 'cc'}) to build {SOURCE.name}")
        return None
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if _trusted(target.parent) is None:
            return None
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        warn(f"cannot write {target.parent} ({exc.strerror or exc})")
        return None
    try:
        done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", tmp, str(SOURCE), "-ldl"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            warn(f"{cc} failed to build {SOURCE.name} (exit {done.returncode}: {last})")
            return None
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)  # whole or absent: a concurrent builder's rename leaves the same bytes
        return target
    except (OSError, subprocess.TimeoutExpired) as exc:
        warn(f"{cc} failed to build {SOURCE.name} ({exc})")
        return None
    finally:
        Path(tmp).unlink(missing_ok=True)


def _trusted(path: Path) -> Path | None:
    """``path`` if it and its directory belong to this user and nobody else can write them (every process of the
    job loads this code); else None after a warning."""
    for p in (path.parent, path) if path.is_file() else (path,):
        st = p.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            warn(f"{p} is not this user's alone (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}): not loaded")
            return None
    return path


def preload_env(env: Mapping[str, str], interface: str, lib: Path | None = None) -> dict[str, str]:
    """The variables to add to ``env`` so that its processes bind wildcard listeners to ``interface``'s address
    (empty when ``interface`` is ``""`` or the library cannot be built)."""
    if not interface:
        return {}
    lib = lib or library()
    if lib is None:
        return {}
    rest = env.get("LD_PRELOAD", "")
    return {ENV: interface, "LD_PRELOAD": f"{lib}:{rest}" if rest else str(lib)}


def require_interface(name: str) -> None:
    """A ``ConfigError`` naming ``cluster.listen_interface`` unless this machine has interface ``name``."""
    have = sorted(n for _, n in socket.if_nameindex())
    if name and name not in have:
        raise ConfigError(f"cluster.listen_interface: this machine has no interface {name!r} (it has "
                          f"{', '.join(have)}); set one of them, or \"\" to leave listeners where they bind")


def main() -> int:
    """Print the library's path (building it if needed); print nothing (the warning on stderr) without one.
    Always exit 0: a batch script goes on without the shim."""
    lib = library()
    if lib is not None:
        print(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
