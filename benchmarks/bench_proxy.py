"""Proxy costs on real local engines: (a) the proxy's overhead on a call, (b) what a mid-call move costs.

Starts two local engine processes (megatron GPTModel on the CPU) and one proxy process, then interleaves, per
repeat (one warm-up not counted):

(a) the same greedy call (``--tokens-short`` new tokens) sent directly to engine e0 and through the proxy
    (pinned to e0 by its run's sticky assignment); reported: median seconds of each, ratio proxy / direct;
(b) the same greedy call (``--tokens-long`` new tokens) through the proxy, watched (the engine's token counter
    polled every 10 ms) until its engine has produced half the tokens; then nothing happens (baseline), or the
    engine is drained (the call moves to the other engine by re-prefill) and added back afterwards. The
    engine the call starts on alternates between e0 and e1 from one repeat to the next (both cases alike), since
    two engine processes on a shared CPU rarely run at the same speed. Reported: median call seconds of each, ratio moved / unmoved, and the move's own cost from the
    event log (``seconds`` from the abort to the resubmission, partial and re-prefill tokens).

Both moved and unmoved answers are checked to be the same tokens (greedy), so a broken move cannot look cheap.
The local engine has no KV cache (it recomputes every sequence each tick), so re-prefill is nearly free there;
with SGLang the re-prefill of prompt + partial output adds prefill time that this benchmark does not show.

    python benchmarks/bench_proxy.py --repeats 7 --write benchmarks/results/proxy.md
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import platform
import statistics
import time

from gyre_hpc.config import EngineConfig, ModelConfig, ProxyConfig
from gyre_hpc.engines.launch import on_free_port, start_local_engine
from gyre_hpc.files.io import atomic_write_text
from gyre_hpc.proxy.client import ProxyClient
from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.proxy.launch import start_proxy

PROMPT = [5, 17, 42, 99, 3, 11, 60, 7]
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _generated(engine) -> int:
    return int(engine._http.get("/server_info").json()["generated_tokens"])


def overhead(proxy: ProxyClient, e0, run: str, n: int) -> tuple[float, float]:
    direct_s, direct = _timed(lambda: e0.generate(PROMPT, {"max_new_tokens": n, **GREEDY}))
    via_s, via = _timed(lambda: proxy.generate(PROMPT, f"{run}/c{time.monotonic_ns()}", {"max_new_tokens": n,
                                                                                          **GREEDY}))
    assert via.output_ids == direct.output_ids and via.meta_info["proxy"]["engines"] == "e0"
    return direct_s, via_s


def pin(proxy: ProxyClient, urls: dict, run: str, engine: str) -> str:
    """Make ``run`` stick to ``engine``: its first call goes there while the other engine is briefly drained."""
    other = "e1" if engine == "e0" else "e0"
    proxy.drain(engine=other)
    served = proxy.generate(PROMPT[:2], f"{run}/pin", {"max_new_tokens": 1, **GREEDY}).meta_info["proxy"]["engines"]
    proxy.add_engine(urls[other], cell=int(other[1]), name=other)
    assert served == engine
    return engine


def watched_call(url: str, proxy: ProxyClient, engines: dict, urls: dict, run: str, n: int, log: str,
                 drain: bool, pinned: str) -> dict:
    """A call watched until its engine produced n/2 tokens; then its engine is drained (``drain``) or not."""
    pin(proxy, urls, run, pinned)
    since = len(read_events(log))
    with concurrent.futures.ThreadPoolExecutor(1) as pool, ProxyClient(url) as harness:
        before = _generated(engines[pinned])
        t0 = time.perf_counter()
        fut = pool.submit(harness.generate, PROMPT, f"{run}/c0", {"max_new_tokens": n, **GREEDY})
        while _generated(engines[pinned]) < before + n // 2:
            time.sleep(0.01)
        if drain:
            proxy.drain(engine=pinned)
        res = fut.result(120)
        seconds = time.perf_counter() - t0
    if drain:
        proxy.add_engine(urls[pinned], cell=int(pinned[1]), name=pinned)
    moves = [e for e in read_events(log)[since:] if e["event"] == "move"]
    assert len(moves) == int(drain), moves
    return {"seconds": seconds, "tokens": res.output_ids, "move": moves[0] if moves else None}


def measure(args: argparse.Namespace, tmp: str) -> dict:
    model, engine_cfg = ModelConfig(), EngineConfig(max_running_requests=8, context_len=256, torch_threads=1)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(on_free_port, start_local_engine, engine_cfg, model, seed=0) for _ in range(2)]
        handles = {f"e{i}": f.result() for i, f in enumerate(futs)}
    log = f"{tmp}/events.jsonl"
    proxy_handle = on_free_port(start_proxy, ProxyConfig(event_log=log))
    res = {"direct": [], "proxy": [], "unmoved": [], "moved": [], "pause": [], "partial": [], "reprefill": []}
    try:
        engines = {n: h.client(timeout=120.0) for n, h in handles.items()}
        urls = {n: h.url for n, h in handles.items()}
        with ProxyClient(proxy_handle.url) as proxy:
            proxy.add_engine(urls["e0"], cell=0, name="e0")
            proxy.generate(PROMPT[:1], "bench-a/pin", {"max_new_tokens": 1})  # run bench-a sticks to e0
            proxy.add_engine(urls["e1"], cell=1, name="e1")
            for r in range(args.repeats + 1):
                d, v = overhead(proxy, engines["e0"], "bench-a", args.tokens_short)
                source = f"e{r % 2}"  # alternate the engines, so their speeds weigh on both cases alike
                u = watched_call(proxy_handle.url, proxy, engines, urls, f"bench-u{r}", args.tokens_long, log, False,
                                 source)
                m = watched_call(proxy_handle.url, proxy, engines, urls, f"bench-m{r}", args.tokens_long, log, True,
                                 source)
                assert m["tokens"] == u["tokens"], "a moved call changed its tokens"
                if r:
                    res["direct"].append(d), res["proxy"].append(v), res["unmoved"].append(u["seconds"])
                    res["moved"].append(m["seconds"]), res["pause"].append(m["move"]["seconds"])
                    res["partial"].append(m["move"]["partial_tokens"])
                    res["reprefill"].append(m["move"]["reprefill_tokens"])
            assert proxy.stats()["runs_lost"] == 0
    finally:
        proxy_handle.stop()
        for h in handles.values():
            h.stop()
    return res


def report(res: dict, args: argparse.Namespace) -> str:
    med = {k: statistics.median(v) for k, v in res.items()}
    ms = lambda xs: ", ".join(f"{1000 * x:.0f}" for x in xs)  # noqa: E731
    return "\n".join([
        "# Proxy overhead and move cost (local engines)",
        "",
        f"- command: `python benchmarks/bench_proxy.py --repeats {args.repeats} --tokens-short {args.tokens_short} "
        f"--tokens-long {args.tokens_long}`",
        f"- machine: 2-core shared CPU ({platform.machine()}, Python {platform.python_version()}), date "
        f"{datetime.date.today().isoformat()}",
        "- two local engines (megatron GPTModel vocab 256, hidden 64, 2 layers, 1 torch thread each) and one proxy "
        "process; greedy calls, prompt 8 tokens; repeats interleaved, one warm-up not counted; medians",
        "",
        "| case | median ms | runs (ms) | ratio |",
        "|---|---|---|---|",
        f"| (a) direct to engine, {args.tokens_short} tokens (baseline) | {1000 * med['direct']:.0f} | "
        f"{ms(res['direct'])} | 1.00 |",
        f"| (a) through the proxy, {args.tokens_short} tokens | {1000 * med['proxy']:.0f} | {ms(res['proxy'])} | "
        f"{med['proxy'] / med['direct']:.2f} |",
        f"| (b) through the proxy, not moved, {args.tokens_long} tokens (baseline) | {1000 * med['unmoved']:.0f} | "
        f"{ms(res['unmoved'])} | 1.00 |",
        f"| (b) moved once (drain at half), {args.tokens_long} tokens | {1000 * med['moved']:.0f} | "
        f"{ms(res['moved'])} | {med['moved'] / med['unmoved']:.2f} |",
        f"| (b) the move itself: abort → resubmission | {1000 * med['pause']:.1f} | "
        f"{', '.join(f'{1000 * x:.1f}' for x in res['pause'])} | |",
        "",
        f"Moves: partial tokens median {med['partial']:.0f}, re-prefill tokens median {med['reprefill']:.0f} "
        "(prompt + partial). Every moved answer equalled the unmoved one token for token; no run was lost.",
        "",
        "Notes",
        "- The local engine has no KV cache, so re-prefill costs it about nothing extra; on SGLang the target would "
        "also prefill prompt + partial output (not measured here; a Mooncake KV mover would avoid it).",
        "- (b) moved includes the drain's wait for the abort answer and the continuation on the other engine.",
        "",
    ])


def main() -> None:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--tokens-short", type=int, default=32)
    p.add_argument("--tokens-long", type=int, default=128)
    p.add_argument("--write", default=None, help="write the markdown report here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        text = report(measure(args, tmp), args)
    print(text)
    if args.write:
        atomic_write_text(args.write, text)


if __name__ == "__main__":
    main()
