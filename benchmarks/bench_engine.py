"""Local engine decode throughput: one request alone vs N concurrent requests (continuous batching).

Starts one real local engine process (megatron GPTModel on the CPU, ``engine.torch_threads`` threads) and sends
through ``AsyncEngineClient``: (a) a single request, (b) ``--concurrency`` requests at once, each with the same
prompt length and ``max_new_tokens`` (``ignore_eos``, so every request decodes its full length). Repeats are
interleaved (single, concurrent, single, ...) so background load hits both alike; one warm-up of each is not
counted. Reported: median output tokens/s of each, and the ratio concurrent / single (the batching gain).

    python benchmarks/bench_engine.py --repeats 5 --concurrency 8 --max-new-tokens 64 \
        --write benchmarks/results/engine.md
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import platform
import statistics
import time

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.client import AsyncEngineClient
from gyre_hpc.engines.launch import on_free_port, start_local_engine
from gyre_hpc.files.io import atomic_write_text


async def run_batch(url: str, n: int, prompt_len: int, max_new: int, seed: int) -> float:
    """Output tokens/s of ``n`` concurrent requests (wall time of the whole batch)."""
    client = AsyncEngineClient(url, timeout=600.0)
    try:
        prompts = [[(seed + 7 * i + j) % 200 + 1 for j in range(prompt_len)] for i in range(n)]
        params = {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 1.0}
        t0 = time.perf_counter()
        results = await asyncio.gather(*(client.generate(p, {**params, "sampling_seed": seed + i})
                                         for i, p in enumerate(prompts)))
        dt = time.perf_counter() - t0
    finally:
        await client.aclose()
    tokens = sum(len(r.output_ids) for r in results)
    assert tokens == n * max_new, f"expected {n * max_new} tokens, got {tokens}"
    return tokens / dt


def measure(url: str, repeats: int, concurrency: int, prompt_len: int, max_new: int) -> dict[str, list[float]]:
    out = {"single": [], "concurrent": []}
    for r in range(repeats + 1):  # r == 0 is the warm-up
        single = asyncio.run(run_batch(url, 1, prompt_len, max_new, seed=r))
        conc = asyncio.run(run_batch(url, concurrency, prompt_len, max_new, seed=r))
        if r:
            out["single"].append(single)
            out["concurrent"].append(conc)
    return out


def report(res: dict[str, list[float]], args: argparse.Namespace, model: ModelConfig, threads: int) -> str:
    single, conc = statistics.median(res["single"]), statistics.median(res["concurrent"])
    runs = lambda xs: ", ".join(f"{x:.0f}" for x in xs)  # noqa: E731
    return "\n".join([
        "# Local engine throughput (continuous batching)",
        "",
        f"- command: `python benchmarks/bench_engine.py --repeats {args.repeats} --concurrency {args.concurrency} "
        f"--prompt-len {args.prompt_len} --max-new-tokens {args.max_new_tokens} --threads {threads}`",
        f"- machine: 2-core shared CPU ({platform.machine()}, Python {platform.python_version()}), "
        f"date {datetime.date.today().isoformat()}",
        f"- model: megatron GPTModel vocab {model.vocab_size}, hidden {model.hidden}, {model.layers} layers "
        f"(embedded CPU default); engine torch threads {threads}; no KV cache (full forward per tick)",
        f"- prompt {args.prompt_len} tokens, {args.max_new_tokens} new tokens per request, "
        f"{args.repeats} interleaved repeats (+1 warm-up), medians",
        "",
        "| case | output tokens/s (median) | runs | ratio vs single |",
        "|---|---|---|---|",
        f"| 1 request (baseline) | {single:.0f} | {runs(res['single'])} | 1.00 |",
        f"| {args.concurrency} concurrent | {conc:.0f} | {runs(res['concurrent'])} | {conc / single:.2f} |",
        "",
    ]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engine process")
    parser.add_argument("--write", default=None, help="also write the markdown table to this file")
    args = parser.parse_args()
    model = ModelConfig()
    engine = EngineConfig(max_running_requests=max(args.concurrency, 1), torch_threads=args.threads,
                          context_len=args.prompt_len + args.max_new_tokens)
    with on_free_port(start_local_engine, engine, model) as handle:
        res = measure(handle.url, args.repeats, args.concurrency, args.prompt_len, args.max_new_tokens)
    text = report(res, args, model, args.threads)
    print(text)
    if args.write:
        atomic_write_text(args.write, text)


if __name__ == "__main__":
    main()
