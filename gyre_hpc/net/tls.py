"""One TLS context per process for every HTTP client of the job: httpx's default verification, built once.

httpx builds a new ``ssl.SSLContext`` for each client or transport created without one, loading certifi's CA bundle
each time: about 45 ms of CPU, and a live run creates dozens (an engine client per agent run, per engine start,
per proxy call site; benchmarks/results/test_cpu.md). The job's own services speak plain HTTP on loopback, where
the context is never used; for an https URL it verifies exactly as httpx's default does.

Invariants
- ``context()`` is ``httpx.create_ssl_context()`` (verify=True; SSL_CERT_FILE / SSL_CERT_DIR honoured as httpx
  does), built at the first call in a process; later calls return the same object.
- httpx is imported at the first call, not at import time.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def context():
    """The process's shared ``ssl.SSLContext`` for httpx clients and transports (``verify=context()``)."""
    import httpx

    return httpx.create_ssl_context()
