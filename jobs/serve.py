"""``gyre serve CONFIG``: the rollout side alone, engines plus the proxy with its OpenAI endpoint, no training.

For evaluating or debugging an agent against the current policy::

    start --engines N engines (engine.kind, the model of the config: model.hf_path and engine.model_path)
    start the proxy (chat template: proxy.openai.tokenizer, else model.hf_path) with the engines registered
    print one line: gyre serve ready url=... openai=URL/runs/RUN/v1 tito=DIR
    every --flush-s: the proxy appends its buffered TITO records to DIR/tito.jsonl
    SIGINT / SIGTERM (or --duration-s): a last flush, then the proxy and the engines stop (by PID)

A run's TITO is complete for ``read_tito`` once its outcome is posted (``POST /tito/outcome``); calls of runs
without an outcome are in the file too (``gyre trajectory stats`` names them).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

from gyre_hpc import auth
from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError
from jobs import add_overrides

DESCRIPTION = """\
gyre serve CONFIG [--engines N] [--port P] [--tito-dir DIR] [--flush-s S] [--duration-s S]

Serves the rollout side of CONFIG: engines and the proxy with its OpenAI endpoint (docs/proxy.md), writing
TITO to DIR/tito.jsonl. Point an agent at OPENAI_BASE_URL=http://HOST:PORT/runs/RUN_ID/v1 (one RUN_ID per run).
Examples:
  gyre serve configs/swe_plugin.yaml
  gyre serve configs/swe_plugin.yaml --engines 2 --port 31000 --tito-dir runs/serve-tito
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config (model, engine, proxy sections)")
    parser.add_argument("--engines", type=int, default=1, help="engines to start (default 1)")
    parser.add_argument("--port", type=int, default=None, help="proxy port (default proxy.port)")
    parser.add_argument("--tito-dir", default=None, help="TITO directory (default RUN.out_dir/serve-TIMESTAMP)")
    parser.add_argument("--flush-s", type=float, default=5.0, help="seconds between TITO flushes (default 5)")
    parser.add_argument("--duration-s", type=float, default=None, help="stop after this long (default: a signal)")
    add_overrides(parser, "model.hf_path=models/tiny-qwen3")


def run(args: argparse.Namespace) -> int:
    from gyre_hpc.engines.launch import start_engine_on_free_port
    from gyre_hpc.proxy.client import ProxyClient
    from gyre_hpc.proxy.launch import start_proxy

    cfg = load_config(args.config, args.overrides)
    if args.engines < 1:
        raise ConfigError(f"--engines: expected >= 1, got {args.engines}")
    tokenizer = cfg.proxy.openai.tokenizer or cfg.model.hf_path
    if tokenizer is None:
        raise ConfigError("model.hf_path: gyre serve needs the model's tokenizer for the OpenAI endpoint "
                          "(set model.hf_path or proxy.openai.tokenizer)")
    out = Path(args.tito_dir or Path(cfg.run.out_dir) / f"serve-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    pcfg = dataclasses.replace(cfg.proxy, event_log=str(out / "proxy-events.jsonl"), tito_dir=str(out),
                               openai=dataclasses.replace(cfg.proxy.openai, tokenizer=tokenizer))
    os.environ[auth.ENV] = auth.new_secret()  # this server's own secret; agents get run keys derived from it
    secret_file = auth.write_secret(out, os.environ[auth.ENV])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    engines, proxy = [], None
    try:
        for i in range(args.engines):
            engines.append(start_engine_on_free_port(cfg.engine, cfg.model, cfg.run.seed,
                                                     log_path=out / f"engine{i}.log"))
        proxy = start_proxy(pcfg, [(i, e.url) for i, e in enumerate(engines)], port=args.port,
                            log_path=out / "proxy.log", config_dir=out)
        print(f"gyre serve ready url={proxy.url} openai={proxy.url}/runs/RUN_ID/v1 tito={out} secret={secret_file} "
              f"(a run's API key: gyre_hpc.auth.run_key(SECRET, RUN_ID))", flush=True)
        deadline = None if args.duration_s is None else time.monotonic() + args.duration_s
        with ProxyClient(proxy.url, timeout=60.0) as client:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                stop.wait(args.flush_s if deadline is None else min(args.flush_s, max(deadline - time.monotonic(), 0)))
                client.flush_tito("tito.jsonl")  # into proxy.tito_dir = out
            stats = client.stats()
        print(json.dumps({"tito": str(out / "tito.jsonl"), "calls_done": stats.get("calls_done", 0)}), flush=True)
        return 0
    finally:
        if proxy is not None:
            proxy.stop()
        for e in engines:
            e.stop()
