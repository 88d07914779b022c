"""Security probe of a live run: what listens, where, and which HTTP route answers a stranger.

    python benchmarks/security_probe.py --json [--config configs/local.yaml] [--steps 2]

It starts a short live run (``gyre train``) and, once a second until it ends,
1. lists every listening socket of every process of the run (psutil ``net_connections`` of the launcher's process
   tree: mpirun, the ranks, the proxy, the engines) with its address; ``0.0.0.0`` and ``::`` count as wildcard;
2. for each HTTP service seen for the first time (the proxy, each engine, restarted ones too) reads its route table
   (its ``/openapi.json``, fetched with the job secret from RUN_DIR/job.secret, as an operator would) and calls
   every route without a token, with a wrong one, and (proxy admin routes) with an agent's run key; anything but
   401 (403 for the run key) counts as open;
3. after the run, counts the run's processes and listening sockets left 10 s after the launcher exited.

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

from gyre_hpc.net import auth  # noqa: E402
from gyre_hpc.net.serving import RUN_PREFIXES, RUN_ROUTES  # noqa: E402

WILDCARD = ("0.0.0.0", "::")


def _role(proc: psutil.Process) -> str:
    if proc.name() in ("mpirun", "orterun", "orted", "prterun", "prted"):
        return "mpirun"
    cmd = " ".join(proc.cmdline())
    for key, role in (("gyre_hpc.localengine.server", "engine"), ("sglang.launch_server", "engine"),
                      ("gyre_hpc.proxy.server", "proxy"), ("gyre_hpc.cli train", "rank")):
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
    """Every listening TCP socket of the process tree under ``pid``; ``http`` marks a service's own port (the
    ``--port`` of an engine or the proxy; their other sockets are torch.distributed's, in-process)."""
    out = []
    for proc in _tree(pid):
        try:
            role, cmd = _role(proc), proc.cmdline()
            port = int(cmd[cmd.index("--port") + 1]) if role in ("proxy", "engine") and "--port" in cmd else None
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    out.append({"pid": proc.pid, "process": role, "ip": conn.laddr.ip, "port": conn.laddr.port,
                                "http": conn.laddr.port == port})
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, IndexError):
            continue
    return out


def _services(found: list[dict]) -> dict[str, str]:
    """URL → role of the HTTP services among the listeners (the proxy and the engines)."""
    return {f"http://{s['ip']}:{s['port']}": s["process"] for s in found if s["http"]}


def _routes(url: str, secret: str) -> list[tuple[str, str]]:
    spec = httpx.get(f"{url}/openapi.json", headers=auth.bearer(secret), timeout=120.0).json()
    routes = [(method.upper(), path) for path, item in spec["paths"].items() for method in item]
    return sorted(set(routes) | {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc")})


def probe_service(client: httpx.Client, url: str, role: str, secret: str, result: dict) -> None:
    """Call every route of one service without a token, with a wrong one and (proxy admin) with a run key."""
    wrong = auth.bearer(auth.new_secret())
    run_key = auth.bearer(auth.run_key(secret, "q0-r0"))

    def status(method: str, path: str, headers: dict) -> int | None:
        try:
            return client.request(method, url + path, json={}, headers=headers).status_code
        except httpx.HTTPError:  # no answer (the service stopped meanwhile): nothing was served
            return None

    try:
        table = _routes(url, secret)
    except httpx.HTTPError:  # an engine stopped between the listing and the probe (its cell switched)
        result["services_gone"].append(url)
        return
    result["services"].append(f"{role} {url}")
    for method, path in table:
        name = f"{role} {method} {path}"
        result["routes"].append(name)
        if status(method, path, {}) not in (401, None):
            result["open_without_secret"].append(name)
        if status(method, path, wrong) not in (401, None):
            result["open_with_wrong_secret"].append(name)
        run_route = path in RUN_ROUTES or path.startswith(RUN_PREFIXES)  # a run key's own (gyre_hpc/net/serving.py)
        if role == "proxy" and not run_route and status(method, path, run_key) not in (403, None):
            result["admin_open_to_run_key"].append(name)


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
    result: dict = {k: [] for k in ("services", "routes", "open_without_secret", "open_with_wrong_secret",
                                    "admin_open_to_run_key", "services_gone")}
    seen: dict[tuple, dict] = {}  # (pid, ip, port) → listener, over the whole run
    pids: set[int] = set()
    probed: set[str] = set()
    try:
        with httpx.Client(timeout=60.0) as client:
            while run.poll() is None and time.monotonic() - t0 < args.timeout:
                now = listeners(run.pid)
                seen.update({(s["pid"], s["ip"], s["port"]): s for s in now})
                pids |= {q.pid for q in _tree(run.pid)}
                run_dir = _run_dir(out_dir)
                for url, role in _services(now).items():
                    if url not in probed and run_dir is not None:
                        probed.add(url)
                        probe_service(client, url, role, (run_dir / auth.SECRET_FILE).read_text(), result)
                time.sleep(1.0)
        rc = run.wait(max(1.0, args.timeout - (time.monotonic() - t0)))
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    found = list(seen.values())
    ended = time.monotonic()
    while time.monotonic() - ended < 10.0:  # orphans: what is left 10 s after the launcher exited
        left = [pid for pid in pids if _alive(pid)]
        if not left:
            break
        time.sleep(0.2)
    still = [c for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.pid in pids]
    wildcard = [s for s in found if s["ip"] in WILDCARD]
    summary = {
        "listeners": len(found), "listeners_http": sum(s["http"] for s in found),
        "listeners_wildcard": len(wildcard),
        "listeners_wildcard_by_process": {r: sum(s["process"] == r for s in wildcard) for r in
                                          sorted({s["process"] for s in wildcard})},
        "services_probed": len(result["services"]), "routes": len(result["routes"]),
        "routes_open_without_secret": len(result["open_without_secret"]),
        "routes_open_with_wrong_secret": len(result["open_with_wrong_secret"]),
        "admin_routes_open_to_run_key": len(result["admin_open_to_run_key"]),
        "run_rc": rc, "orphans_after_10s": len(left), "ports_listening_after_10s": len(still),
        "listeners_detail": found, "services": result["services"],
        "open": {k: v for k, v in result.items() if k not in ("routes", "services") and v},
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
