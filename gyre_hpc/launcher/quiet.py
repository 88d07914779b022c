"""Third-party log noise: silenced by default, shown with ``--verbose`` (or ``GYRE_VERBOSE=1``).

The setting lives in the environment variable ``GYRE_VERBOSE``, so every child process inherits it without a
flag: mpirun's ranks, the engines and the proxy they start, spawned weight publishers, SLURM steps (sbatch and
srun export the submitting environment by default).

What quiet mode silences (lines a normal run prints that tell the user nothing; measured on this machine):

- Mooncake Transfer Engine, while an engine starts (``transfer/mooncake.py``)::

      WARNING: Logging before InitGoogleLogging() is written to STDERR
      E1201 21:57:47.894724 27160 transfer_metadata.cpp:1098] Local segment descriptor not found

  P2P-handshake mode has no metadata server, and Mooncake logs the lookup miss at ERROR level. Neither
  ``MC_LOG_LEVEL`` (its quietest level is ERROR) nor glog's ``GLOG_minloglevel`` (Mooncake overrides it) hides
  it, and native code writes it to file descriptor 2; so ``native_stderr_filtered`` captures descriptor 2 while
  the engine starts and re-emits every other line.
- anyio's ``RuntimeWarning: coroutine 'connect_tcp.<locals>.try_connect' was never awaited`` (printed at exit
  of the rank that ran the agent harness; a happy-eyeballs attempt that was cancelled before it started).

Invariants
- Only the listed lines are dropped. The other lines written during a capture are re-emitted in their order,
  after it (even when the captured call raises); the capture covers only the call that makes the noise.
- Verbose mode drops nothing and captures nothing. ``--verbose`` turns it on for this process and its children;
  without the flag the inherited setting stands (a rank keeps what ``gyre train --verbose`` chose).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from typing import Iterator

ENV = "GYRE_VERBOSE"

#: native stderr lines of Mooncake's engine start-up that quiet mode drops
MOONCAKE_NOISE = (
    re.compile(rb"^WARNING: Logging before InitGoogleLogging\(\) is written to STDERR$"),
    re.compile(rb"^E\d{4} [\d:.]+ +\d+ transfer_metadata\.cpp:\d+\] Local segment descriptor not found$"),
)

#: Python warnings quiet mode ignores: (message regex, category)
WARNINGS = ((r"coroutine 'connect_tcp\.<locals>\.try_connect' was never awaited", RuntimeWarning),)


def verbose() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes")


def configure(verbose_flag: bool = False) -> bool:
    """Apply the setting to this process (``--verbose`` exports it to the children); returns whether verbose."""
    if verbose_flag:
        os.environ[ENV] = "1"
    if not verbose():
        for message, category in WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
    return verbose()


@contextlib.contextmanager
def native_stderr_filtered(noise: tuple[re.Pattern, ...]) -> Iterator[None]:
    """Capture file descriptor 2 (native libraries write there directly) for the duration of the block; then
    write back every captured line that matches none of ``noise``. Verbose mode: a plain pass-through."""
    if verbose():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().splitlines(keepends=True)
                    if not any(p.match(line.rstrip(b"\r\n")) for p in noise)]
            if kept:
                os.write(2, b"".join(kept))
