"""Security probe of a live run: what listens, where, and which HTTP route answers a stranger.

    python benchmarks/security_probe.py --json [--config configs/local.yaml] [--steps 2]

It starts a short live run (``gyre train``), waits until the proxy and at least one engine serve, then
1. lists every listening socket of every process of the run (psutil ``net_connections`` of the launcher's process
   tree: mpirun, the ranks, the proxy, the engines) with its address; ``0.0.0.0`` and ``::`` count as wildcard;
2. reads each HTTP service's route table (its ``/openapi.json``, fetched with the job secret from RUN_DIR/job.secret,
   as an operator would) and calls every route without a token, with a wrong one, and (admin routes) with an
   agent's run key; anything but 401 (403 for the run key) counts as open;
3. lets the run finish and counts the run's processes and ports left 10 s after the launcher exited.

It prints ``{"listeners_wildcard", "routes", "routes_open_without_secret", ...}`` (details under ``listeners``
and ``open``). BENCHMARKS.md and docs/reliability.md record the result.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gyre_hpc import auth  # noqa: E402
from gyre_hpc.serving import RUN_ROUTES  # noqa: E402

WILDCARD = ("0.0.0.0", "::")


def _role(proc: psutil.Process) -> str:
    cmd = " ".join(proc.cmdline())
    for key, role in (("gyre_hpc.engines.local", "engine"), ("sglang.launch_server", "engine"),
                      ("gyre_hpc.proxy.server", "proxy"), ("gyre_hpc.cli train", "rank"),
                      ("mpirun", "mpirun"), ("orted", "mpirun")):
        if key in cmd:
            return role
    return proc.name()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listeners(pid: int) -> list[dict]:
    """Every listening TCP socket of the process tree under ``pid``."""
    out = []
    for proc in _tree(pid):
        try:
            role = _role(proc)
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    out.append({"pid": proc.pid, "process": role, "ip": conn.laddr.ip, "port": conn.laddr.port})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _services(found: list[dict]) -> dict[str, str]:
    """URL → role of the HTTP services among the listeners (the proxy and the engines)."""
    return {f"http://{s['ip']}:{s['port']}": s["process"] for s in found if s["process"] in ("proxy", "engine")}


def _routes(url: str, secret: str) -> list[tuple[str, str]]:
    spec = httpx.get(f"{url}/openapi.json", headers=auth.bearer(secret), timeout=30.0).json()
    routes = [(method.upper(), path) for path, item in spec["paths"].items() for method in item]
    return sorted(set(routes) | {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc")})


def probe_routes(services: dict[str, str], secret: str) -> dict:
    wrong = auth.bearer(auth.new_secret())
    run_key = auth.bearer(auth.run_key(secret, "q0-r0"))
    routes, open_plain, open_wrong, open_run_key = [], [], [], []
    with httpx.Client(timeout=30.0) as client:
        for url, role in sorted(services.items()):
            for method, path in _routes(url, secret):
                routes.append(f"{role} {method} {path}")
                if client.request(method, url + path, json={}).status_code != 401:
                    open_plain.append(f"{role} {method} {path}")
                if client.request(method, url + path, json={}, headers=wrong).status_code != 401:
                    open_wrong.append(f"{role} {method} {path}")
                if role == "proxy" and path not in RUN_ROUTES:
                    if client.request(method, url + path, json={}, headers=run_key).status_code != 403:
                        open_run_key.append(f"{role} {method} {path}")
    return {"routes": routes, "open_without_secret": open_plain, "open_with_wrong_secret": open_wrong,
            "admin_open_to_run_key": open_run_key}


def _run_dir(out_dir: Path) -> Path | None:
    dirs = [d for d in out_dir.iterdir() if (d / auth.SECRET_FILE).is_file()] if out_dir.is_dir() else []
    return dirs[0] if dirs else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "local.yaml"))
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds the live run may take in all")
    args = p.parse_args()
    out_dir = Path(tempfile.mkdtemp(prefix="gyre-probe-"))
    env = {k: v for k, v in os.environ.items() if k != auth.ENV}  # the launcher makes the job's own secret
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH")) if x)
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", args.config, "--set", f"allocator.steps={args.steps}",
           "--set", f"run.out_dir={out_dir}"]
    t0 = time.monotonic()
    with open(out_dir / "probe-run.log", "wb") as log:
        run = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        found: list[dict] = []
        while run.poll() is None and time.monotonic() - t0 < args.timeout:
            found = listeners(run.pid)
            roles = {s["process"] for s in found}
            if {"proxy", "engine"} <= roles:
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"the run ended or timed out before its proxy and an engine served; see {out_dir}")
        secret = (_run_dir(out_dir) / auth.SECRET_FILE).read_text()
        found = listeners(run.pid)
        result = probe_routes(_services(found), secret)
        pids = {s["pid"] for s in found} | {q.pid for q in _tree(run.pid)}
        ports = {s["port"] for s in found}
        rc = run.wait(max(1.0, args.timeout - (time.monotonic() - t0)))
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    ended = time.monotonic()
    while time.monotonic() - ended < 10.0:  # orphans: what is left 10 s after the launcher exited
        left = [pid for pid in pids if _alive(pid)]
        if not left:
            break
        time.sleep(0.2)
    still = {c.laddr.port for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN} & ports
    wildcard = [s for s in found if s["ip"] in WILDCARD]
    summary = {
        "listeners": len(found), "listeners_wildcard": len(wildcard),
        "listeners_wildcard_by_process": {r: sum(s["process"] == r for s in wildcard) for r in
                                          sorted({s["process"] for s in wildcard})},
        "routes": len(result["routes"]), "routes_open_without_secret": len(result["open_without_secret"]),
        "routes_open_with_wrong_secret": len(result["open_with_wrong_secret"]),
        "admin_routes_open_to_run_key": len(result["admin_open_to_run_key"]),
        "run_rc": rc, "orphans_after_10s": len(left), "ports_listening_after_10s": len(still),
        "listeners_detail": found, "open": {k: v for k, v in result.items() if k != "routes" and v},
        "run_dir": str(_run_dir(out_dir)),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        for k, v in summary.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
