"""The embedded default's model before and after it became a tiny Qwen3 checkpoint (issue 10): CPU cost of what a
live run repeats, on one torch thread, the two models interleaved in every repeat (CPU seconds, not wall: the
machine is shared).

- ``tick``: one local-engine decode tick without KV cache, 16 running requests of 48 tokens (the synthetic agent's
  context_budget is 40): full-vocabulary logits ``[16, 48, V]``.
- ``train``: one forward + backward of 8 rows x 128 tokens with a log-softmax loss.
- ``build``: building the policy as an engine or a trainer does (``build_model``; the new one reads its safetensors).
- ``materialise``: what ``gyre train`` adds before mpirun, in a fresh process: cold (empty cache: imports torch and
  transformers, ``init_model``) and warm (a cache hit: a copy of 1 MB).

    python benchmarks/bench_default_model.py --repeats 7 [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the default's model section before issue 10 (configs/local.yaml at commit cb17aab)
BEFORE = {"vocab_size": 256, "hidden": 64, "layers": 2, "heads": 4}


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def materialise_cpu(run_dir: Path, cache: Path) -> tuple[float, float]:
    """(CPU s, wall s) of a fresh process that materialises the default's initial model into ``run_dir``."""
    code = ("from gyre_hpc.config import load_config; from gyre_hpc.models import run_init; "
            f"run_init.materialise(load_config('configs/local.yaml'), {str(run_dir)!r})")
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    c0, t0 = child_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    return child_cpu() - c0, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from gyre_hpc.config import ModelConfig, load_config
    from gyre_hpc.models import run_init
    from gyre_hpc.models.check import causal_mask
    from gyre_hpc.train.model import build_model, forward_logits

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-default-model-"))
    cfg = load_config(str(ROOT / "configs" / "local.yaml"))
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    run_init.materialise(cfg, tmp / "run")
    models = {"before": ModelConfig(**BEFORE), "after": run_init.for_run(cfg, tmp / "run").model}

    def tick(model, vocab):
        ids = torch.randint(0, vocab, (16, 48))
        pos = torch.arange(48).expand(16, 48)
        with torch.no_grad():
            forward_logits(model, ids, pos, causal_mask(48))

    def train(model, vocab):
        ids = torch.randint(0, vocab, (8, 128))
        logits = forward_logits(model, ids, torch.arange(128).expand(8, 128), causal_mask(128))
        torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).mean().backward()
        model.zero_grad(set_to_none=True)

    built = {k: build_model(m).train() for k, m in models.items()}
    for k in models:  # warm-up
        tick(built[k], models[k].vocab_size)
        train(built[k], models[k].vocab_size)
    res: dict[str, dict[str, list[float]]] = {k: {"tick": [], "train": [], "build": []} for k in models}
    for _ in range(args.repeats):
        for k, m in models.items():
            for name, fn in (("tick", lambda: tick(built[k], m.vocab_size)),
                             ("train", lambda: train(built[k], m.vocab_size)),
                             ("build", lambda: build_model(m))):
                t0 = time.process_time()
                fn()
                res[k][name].append(time.process_time() - t0)
    cold = [materialise_cpu(tmp / f"cold{i}", tmp / f"cold-cache{i}") for i in range(min(3, args.repeats))]
    warm = [materialise_cpu(tmp / f"warm{i}", tmp / "cache") for i in range(min(3, args.repeats))]
    out = {k: {n: statistics.median(v) for n, v in r.items()} for k, r in res.items()}
    out["materialise"] = {"cold_cpu_s": statistics.median(c for c, _ in cold),
                          "cold_wall_s": statistics.median(w for _, w in cold),
                          "warm_cpu_s": statistics.median(c for c, _ in warm),
                          "warm_wall_s": statistics.median(w for _, w in warm)}
    out["ratio_after_over_before"] = {n: out["after"][n] / out["before"][n] for n in ("tick", "train", "build")}
    out["load"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(out))
        return
    for n in ("tick", "train", "build"):
        print(f"{n:6s} before {out['before'][n] * 1e3:8.2f} ms CPU  after {out['after'][n] * 1e3:8.2f} ms CPU  "
              f"ratio {out['ratio_after_over_before'][n]:.2f}")
    m = out["materialise"]
    print(f"materialise cold {m['cold_cpu_s']:.2f} CPU s ({m['cold_wall_s']:.1f} s wall), warm "
          f"{m['warm_cpu_s']:.2f} CPU s ({m['warm_wall_s']:.1f} s wall); load {out['load']:.1f}")


if __name__ == "__main__":
    main()
