"""``gyre serve CONFIG``: the rollout side alone, engines plus the proxy with its OpenAI endpoint, no training.

For evaluating or debugging an agent against the current policy::

    the model: model.hf_path (it wins over the config's other model fields, with one printed note), else the tiny
        Qwen3-format model `gyre train` would write (DIR/model/init, gyre_hpc.models.run_init)
    start --engines N engines (engine.kind, the model of the config: model.hf_path and engine.model_path)
    start the proxy (chat template: proxy.openai.tokenizer, else model.hf_path) with the engines registered
    print, per --run RUN (default: one run, ``DEFAULT_RUN``), two lines to paste into an agent's shell:
        export OPENAI_BASE_URL=URL/runs/RUN/v1
        export OPENAI_API_KEY=run.RUN.MAC          (the run's key: it reaches that run's calls only)
    then one line: gyre serve ready url=... openai=URL/runs/RUN_ID/v1 tito=DIR secret=FILE
    every --flush-s: the proxy appends its buffered TITO records to DIR/tito.jsonl
    SIGINT / SIGTERM (or --duration-s): a last flush, then the proxy and the engines stop (by PID)

A run's TITO is complete for ``read_tito`` once its outcome is posted (``POST /tito/outcome``); calls of runs
without an outcome are in the file too (``gyre trajectory stats`` names them). A key this server did not make
(another server's, a stale one) is a 401 whose message says how to get one (gyre_hpc.net.serving).

Invariants (tests/integration/test_serve.py)
- Every printed key is ``auth.run_key(secret, RUN)`` for the secret in DIR/job.secret, and every export line
  is printed before the ready line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import threading
import sys
from pathlib import Path

from gyre_hpc.net import auth
from gyre_hpc.clock import WallClock
from gyre_hpc.config import GyreConfig, ProxyConfig, apply_overrides, build, read_yaml, resolve_relative
from gyre_hpc.errors import ConfigError
from gyre_hpc.files.hf_config import yield_to_checkpoint
from gyre_hpc.models import run_init
from gyre_hpc.rundir import RunDir
from jobs import add_overrides

#: the run whose lines are printed when no --run is given (a newcomer's first agent)
DEFAULT_RUN = "run0"

DESCRIPTION = """\
gyre serve CONFIG [--run RUN_ID ...] [--engines N] [--port P] [--tito-dir DIR] [--flush-s S] [--duration-s S]

Serves the rollout side of CONFIG: engines and the proxy with its OpenAI endpoint (docs/proxy.md), writing
TITO to DIR/tito.jsonl. Prints, per --run (default: one run, run0), the two lines an agent needs:
export OPENAI_BASE_URL=http://HOST:PORT/runs/RUN_ID/v1 and export OPENAI_API_KEY=<that run's key>.
Without model.hf_path the config's tiny model is written to DIR/model/init (as gyre train does).
Examples:
  gyre serve configs/local.yaml
  gyre serve configs/local.yaml --run agent-a --run agent-b --set model.hf_path=models/tiny-qwen3
  gyre serve configs/swe_plugin.yaml --engines 2 --port 31000 --tito-dir runs/serve-tito
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config (model, engine, proxy sections)")
    parser.add_argument("--run", dest="runs", action="append", default=[], metavar="RUN_ID",
                        help=f"a run to print OPENAI_BASE_URL / OPENAI_API_KEY lines for (repeatable; "
                             f"default {DEFAULT_RUN})")
    parser.add_argument("--engines", type=int, default=1, help="engines to start (default 1)")
    parser.add_argument("--port", type=int, default=None,
                        help="proxy port (default proxy.port, or a free one when that is taken)")
    parser.add_argument("--tito-dir", default=None, help="TITO directory (default RUN.out_dir/serve-TIMESTAMP)")
    parser.add_argument("--flush-s", type=float, default=5.0, help="seconds between TITO flushes (default 5)")
    parser.add_argument("--duration-s", type=float, default=None, help="stop after this long (default: a signal)")
    add_overrides(parser, "model.hf_path=models/tiny-qwen3")


def run(args: argparse.Namespace) -> int:
    from gyre_hpc.engines.launch import start_engine_on_free_port
    from gyre_hpc.proxy.client import ProxyClient
    from gyre_hpc.proxy.launch import start_proxy
    from gyre_hpc.proxy.routing import ProxyError

    cfg = load_serving_config(args.config, args.overrides)
    if args.engines < 1:
        raise ConfigError(f"--engines: expected >= 1, got {args.engines}")
    runs = list(dict.fromkeys(args.runs or [DEFAULT_RUN]))
    for run_id in runs:
        if not run_id or run_id.strip() != run_id or any(c in run_id for c in "?#% "):
            raise ConfigError(f"--run {run_id!r}: a run id is a non-empty path segment without spaces, ?, # or %")
    if args.tito_dir:
        out = RunDir.at(Path(args.tito_dir).resolve()).path
    else:
        out = RunDir.new(cfg.run.out_dir, "serve", absolute=True).path
    cfg = run_init.prepare(cfg, out, "gyre serve")  # the tiny Qwen3-format model `gyre train` would write
    tokenizer = cfg.proxy.openai.tokenizer or cfg.model.hf_path
    if tokenizer is None:
        raise ConfigError("model.hf_path: gyre serve needs the model's tokenizer for the OpenAI endpoint, and this "
                          "config's model is megatron-only (model.qk_layernorm: false, no model.hf_path); set "
                          "model.hf_path (e.g. `gyre model init --arch qwen3 --out models/tiny-qwen3`), "
                          "proxy.openai.tokenizer, or model.qk_layernorm=true for the tiny Qwen3 model")
    pcfg = dataclasses.replace(cfg.proxy, event_log=str(out / "proxy-events.jsonl"), tito_dir=str(out),
                               openai=dataclasses.replace(cfg.proxy.openai, tokenizer=tokenizer))
    secret = os.environ[auth.ENV] = auth.new_secret()  # this server's own secret; agents get run keys from it
    secret_file = auth.write_secret(out, secret)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    engines, proxy = [], None
    try:
        for i in range(args.engines):
            engines.append(start_engine_on_free_port(cfg.engine, cfg.model, cfg.run.seed,
                                                     log_path=out / f"engine{i}.log"))
        proxy = start_proxy(pcfg, [(i, e.url) for i, e in enumerate(engines)], port=proxy_port(pcfg, args.port),
                            log_path=out / "proxy.log", config_dir=out)
        for run_id in runs:
            print(f"# run {run_id}: paste into the agent's shell\n{export_lines(proxy.url, secret, run_id)}")
        print(f"gyre serve ready url={proxy.url} openai={proxy.url}/runs/RUN_ID/v1 tito={out} secret={secret_file} "
              f"(another run's key: gyre serve ... --run RUN_ID, or gyre_hpc.net.auth.run_key(SECRET, RUN_ID))",
              flush=True)
        clock = WallClock()
        deadline = None if args.duration_s is None else clock.now() + args.duration_s
        with ProxyClient(proxy.url, timeout=300.0) as client:
            while not stop.is_set() and (deadline is None or clock.now() < deadline):
                stop.wait(args.flush_s if deadline is None else min(args.flush_s, max(deadline - clock.now(), 0)))
                try:
                    client.flush_tito("tito.jsonl")  # into proxy.tito_dir = out
                except ProxyError as exc:  # a busy proxy on a loaded machine: the records wait for the next flush
                    if not stop.is_set():
                        print(f"gyre serve: warning: TITO flush failed, retried in {args.flush_s:g} s: {exc}",
                              file=sys.stderr, flush=True)
            client.flush_tito("tito.jsonl")  # the last one: every record of the calls answered so far
            stats = client.stats()
        print(json.dumps({"tito": str(out / "tito.jsonl"), "calls_done": stats.get("calls_done", 0)}), flush=True)
        return 0
    finally:
        if proxy is not None:
            proxy.stop()
        for e in engines:
            e.stop()


def export_lines(url: str, secret: str, run_id: str) -> str:
    """The two shell lines that point an OpenAI client at ``run_id``'s endpoint with that run's key."""
    return f"export OPENAI_BASE_URL={url}/runs/{run_id}/v1\nexport OPENAI_API_KEY={auth.run_key(secret, run_id)}"


def load_serving_config(path: str, overrides: list[str]) -> GyreConfig:
    """``load_config`` where model.hf_path wins: the config's model fields that differ from the checkpoint's
    config.json are dropped with one note on stderr, not a conflict error (serving builds no model; a
    `gyre model init` directory with any arguments serves under any shipped config)."""
    data = apply_overrides(resolve_relative(read_yaml(path), Path(path).resolve().parent), overrides)
    hf_path = data.get("model", {}).get("hf_path") if isinstance(data.get("model"), dict) else None
    if hf_path and not (Path(str(hf_path)).expanduser() / "config.json").is_file():
        raise ConfigError(f"model.hf_path: {hf_path} is not a model directory yet; make one with "
                          f"`gyre model init --arch qwen3 --out {hf_path}` (the config's comments name its --context), "
                          f"then run this again")
    if isinstance(data.get("model"), dict):
        data["model"], notes = yield_to_checkpoint(data["model"])
        if notes:
            print(f"gyre serve: note: model.hf_path's config.json wins over the config's model fields "
                  f"({'; '.join(notes)})", file=sys.stderr, flush=True)
    return build(GyreConfig, data)


def proxy_port(cfg: ProxyConfig, port: int | None) -> int:
    """``port`` when given; else ``proxy.port``, or a free port (with a note) when something listens there: a
    second `gyre serve`, or a training job's proxy, must not stop a newcomer's (the printed lines carry the URL)."""
    import socket

    from gyre_hpc.engines.launch import free_port

    if port is not None:
        return port
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((cfg.host, cfg.port))
            return cfg.port
        except OSError:
            pass
    chosen = free_port(cfg.host)
    print(f"gyre serve: note: proxy.port {cfg.port} is taken; serving on {chosen}", file=sys.stderr, flush=True)
    return chosen
