"""SGLang 0.5.23 vs the local engine: output tokens/s at 1, 8 and 16 concurrent requests, on the CPU.

Both engines run at once (so background load hits both alike) and repeats are interleaved: for each repeat and
each concurrency, the local engine then SGLang. Every request has the same prompt length and ``max_new_tokens``
(``ignore_eos``, so each decodes its full length); one warm-up round is not counted. Reported: median tokens/s per
engine and concurrency, and SGLang / local (measured in the same run).

The same checkpoint on both sides: one tiny Hugging Face Qwen3 made by ``gyre model init`` (hidden 64, 2 layers,
head_dim 16, vocab 1024); the local engine builds its megatron GPTModel from it (``model.hf_path``), SGLang
serves the directory. (The first recorded run, in benchmarks/results/engines.md, predates the HF bridge: the local
engine then served the project's own random model of the same width and depth.)

    python benchmarks/bench_engines.py --repeats 3 --max-new-tokens 64 --write benchmarks/results/engines.md
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import platform
import statistics
import tempfile
import time
from pathlib import Path

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.client import AsyncEngineClient
from gyre_hpc.engines.launch import on_free_port, start_engine
from gyre_hpc.files.io import atomic_write_text

CONCURRENCY = (1, 8, 16)


async def run_batch(url: str, n: int, prompt_len: int, max_new: int, seed: int) -> float:
    """Output tokens/s of ``n`` concurrent requests (wall time of the whole batch)."""
    client = AsyncEngineClient(url, timeout=600.0)
    try:
        prompts = [[(seed + 7 * i + j) % 200 + 3 for j in range(prompt_len)] for i in range(n)]
        params = {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 1.0}
        t0 = time.perf_counter()
        results = await asyncio.gather(*(client.generate(p, params, return_logprob=True) for p in prompts))
        dt = time.perf_counter() - t0
    finally:
        await client.aclose()
    tokens = sum(len(r.output_ids) for r in results)
    assert tokens == n * max_new, f"expected {n * max_new} tokens, got {tokens}"
    return tokens / dt


def report(res: dict, args: argparse.Namespace) -> str:
    med = {k: statistics.median(v) for k, v in res.items()}
    runs = lambda xs: ", ".join(f"{x:.0f}" for x in xs)  # noqa: E731
    lines = [
        "# SGLang vs the local engine (CPU)", "",
        f"- command: `python benchmarks/bench_engines.py --repeats {args.repeats} --prompt-len {args.prompt_len} "
        f"--max-new-tokens {args.max_new_tokens}`",
        f"- machine: 2-core shared CPU ({platform.machine()}, Python {platform.python_version()}), "
        f"date {datetime.date.today().isoformat()}; both engines up at once, repeats interleaved, medians",
        "- one checkpoint on both sides: a tiny HF Qwen3 from `gyre model init` (vocab 1024, hidden 64, 2 layers, "
        "head_dim 16); local engine: megatron GPTModel loaded from it (model.hf_path), 1 torch thread, no KV cache; "
        "SGLang 0.5.23 (--device cpu, torch_native attention) serving the directory", "",
        "| concurrent requests | local tok/s (median) | SGLang tok/s (median) | SGLang / local | local runs | "
        "SGLang runs |",
        "|---|---|---|---|---|---|",
    ]
    for n in CONCURRENCY:
        lo, sg = med[("local", n)], med[("sglang", n)]
        lines.append(f"| {n} | {lo:.0f} | {sg:.0f} | {sg / lo:.2f} | {runs(res[('local', n)])} | "
                     f"{runs(res[('sglang', n)])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--write", default=None, help="also write the markdown table to this file")
    args = parser.parse_args()
    from gyre_hpc.models.init import init_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    context = args.prompt_len + args.max_new_tokens + 16  # with exactly prompt + max_new, SGLang gave 62 of 64
    common = dict(max_running_requests=max(CONCURRENCY), context_len=context, startup_timeout_s=900.0)
    model = init_model("qwen3", tmp / "qwen3-tiny", head_dim=16, ffn=128)
    local_cfg = EngineConfig(**common)
    sglang_cfg = EngineConfig(kind="sglang", model_path=str(model), **common)
    res: dict = {(k, n): [] for k in ("local", "sglang") for n in CONCURRENCY}
    with on_free_port(start_engine, local_cfg, ModelConfig(hf_path=str(model)), log_path=tmp / "local.log") as local, \
            on_free_port(start_engine, sglang_cfg, ModelConfig(), log_path=tmp / "sglang.log") as sglang:
        for r in range(args.repeats + 1):  # r == 0 is the warm-up
            for n in CONCURRENCY:
                for kind, handle in (("local", local), ("sglang", sglang)):
                    tps = asyncio.run(run_batch(handle.url, n, args.prompt_len, args.max_new_tokens, seed=r))
                    if r:
                        res[(kind, n)].append(tps)
    text = report(res, args)
    print(text)
    if args.write:
        atomic_write_text(args.write, text)


if __name__ == "__main__":
    main()
