"""Per-job authentication of every HTTP listener: the job secret and run-scoped keys. Core (stdlib only).

A job has one secret (``new_secret``), generated at launch, kept 0600 in the run dir (``write_secret``) and handed
to ranks and their children through the environment variable ``GYRE_JOB_SECRET`` (never on a command line).
Every HTTP request carries ``Authorization: Bearer <token>``; a server accepts (``grant``):

- the job secret: everything (the runtime, its admin calls, the engines);
- a run key ``run.<run_id>.<mac>`` with ``mac = HMAC-SHA256(secret, "gyre-run:" + run_id)``: only that run's own
  calls on the proxy (``/generate``, its ``/abort_request``, its ``/tito/outcome``). An agent is given its run key,
  never the job secret, and cannot derive another run's key from it.

Invariants (tests/unit/test_auth.py)
- Comparisons are constant-time (``hmac.compare_digest``); a missing, malformed or wrong token grants nothing.
- A run key grants exactly the run it names; changing the run id or the mac invalidates it.
- ``write_secret`` leaves a file readable by its owner only (mode 0600), also when the file existed before.
- ``refusal`` (the message of every 401) never contains the secret or a valid key; where run keys are accepted
  it says how to get one, and names the run of a run key this server did not make.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import MutableMapping

ENV = "GYRE_JOB_SECRET"
SECRET_FILE = "job.secret"
_RUN_PREFIX = "run."


@dataclass(frozen=True)
class Grant:
    """What a request's token allows: the whole job (``run_id`` None) or one run's calls."""

    run_id: str | None = None

    @property
    def job(self) -> bool:
        return self.run_id is None


def new_secret() -> str:
    """A random URL-safe token that never starts with '-': SGLang expands its --config file into command-line
    arguments, and argparse takes ``--api-key -Qx...`` for a missing value (a live run failed so, 1 in 64 odds)."""
    while (secret := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return secret


def job_secret(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The job secret of this process (``GYRE_JOB_SECRET``), or None."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    return value or None


def ensure_secret(environ: MutableMapping[str, str] | None = None) -> str:
    """The job secret, generated and put into ``environ`` (default ``os.environ``) when there is none yet, so
    that every child process started from here inherits it."""
    environ = os.environ if environ is None else environ
    secret = job_secret(environ)
    if secret is None:
        secret = environ[ENV] = new_secret()
    return secret


def write_secret(run_dir: str | Path, secret: str) -> Path:
    """``RUN_DIR/job.secret``, mode 0600 (created so; an existing file is chmodded before it is written)."""
    path = Path(run_dir) / SECRET_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, secret.encode())
    finally:
        os.close(fd)
    return path


def _mac(secret: str, run_id: str) -> str:
    return hmac.new(secret.encode(), b"gyre-run:" + run_id.encode(), hashlib.sha256).hexdigest()


def run_key(secret: str, run_id: str) -> str:
    """The key that lets an agent make its own run's calls, and nothing else."""
    return f"{_RUN_PREFIX}{run_id}.{_mac(secret, run_id)}"


def bearer(token: str | None) -> dict[str, str]:
    """The request header carrying ``token`` (none when there is no token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def token_of(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def grant(header: str | None, secret: str, run_keys: bool = False) -> Grant | None:
    """What the ``Authorization`` header value allows against ``secret`` (run keys only where ``run_keys``)."""
    token = token_of(header)
    if token is None:
        return None
    if hmac.compare_digest(token.encode(), secret.encode()):
        return Grant()
    if run_keys and token.startswith(_RUN_PREFIX):
        run_id, _, mac = token[len(_RUN_PREFIX):].rpartition(".")
        if run_id and hmac.compare_digest(mac.encode(), _mac(secret, run_id).encode()):
            return Grant(run_id)
    return None


def refusal(header: str | None, run_keys: bool = False) -> str:
    """The message of a 401 for the ``Authorization`` header value ``header`` that ``grant`` refused."""
    if not run_keys:
        return "missing or wrong credentials: send Authorization: Bearer <job secret>"
    how = ("`gyre serve CONFIG --run RUN_ID` prints a run's lines to paste (export OPENAI_BASE_URL=... and "
           "export OPENAI_API_KEY=...); an agent of a `gyre train` job is given its run's key as OPENAI_API_KEY")
    token = token_of(header) or ""
    run_id = token[len(_RUN_PREFIX):].rpartition(".")[0] if token.startswith(_RUN_PREFIX) else ""
    if run_id:
        return (f"unknown key for run {run_id!r}: this server did not make it (a key of another server, or of "
                f"an earlier `gyre serve`, does not work here); get this server's key: {how}")
    return f"missing or wrong credentials: send Authorization: Bearer <run key>; to get a key: {how}"
