"""``gyre model``: Hugging Face model directories in and out (init, export, check). Formats in docs/models.md."""
from __future__ import annotations

import argparse
import json

from gyre_hpc.models.init import DEFAULTS

DESCRIPTION = """\
gyre model init --arch qwen3|qwen2|qwen3_moe --out DIR [--hidden N --layers N --heads N --kv-heads N --vocab N
                --context N --head-dim N --ffn N --tie --seed N
                --experts N --topk N --moe-ffn N]                   a tiny random model + trained tokenizer
gyre model export CKPT_OR_RUN_DIR --out DIR                          trained weights -> a Hugging Face directory
gyre model check DIR [--json]                                        transformers vs megatron logits, round trip

A directory from init or export loads with transformers' AutoModelForCausalLM / AutoTokenizer and SGLang's
--model-path; train it with --set model.hf_path=DIR. Examples:
  gyre model init --arch qwen3 --out models/tiny-qwen3 --context 4096
  gyre model check models/tiny-qwen3 --json
  gyre model export runs/local-20261201-120000 --out models/trained
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = sub.add_parser("init", help="write a small random Qwen2/Qwen3 model with a locally trained tokenizer")
    init.add_argument("--arch", required=True, choices=["qwen3", "qwen2", "qwen3_moe"])
    init.add_argument("--out", required=True, help="output directory (created; must not exist unless --force)")
    for name, default in DEFAULTS.items():
        init.add_argument("--" + name.replace("_", "-"), type=int, default=default, metavar="N",
                          help=f"default {default}")
    init.add_argument("--head-dim", type=int, metavar="N", help="per-head channels (Qwen3; default hidden/heads)")
    init.add_argument("--ffn", type=int, metavar="N", help="MLP size per projection (default 4*hidden)")
    init.add_argument("--tie", action="store_true", help="tie the input embedding and the output layer")
    init.add_argument("--experts", type=int, default=8, metavar="N", help="routed experts per layer (qwen3_moe)")
    init.add_argument("--topk", type=int, default=2, metavar="N", help="experts per token (qwen3_moe)")
    init.add_argument("--moe-ffn", type=int, metavar="N", help="each expert's MLP size (qwen3_moe; default hidden)")
    init.add_argument("--force", action="store_true", help="replace --out if it exists")
    export = sub.add_parser("export", help="write trained weights (run, weights or checkpoint dir) as an HF model")
    export.add_argument("source", help="a run directory, RUN/weights/vNNNNNN, or a checkpoint directory")
    export.add_argument("--out", required=True, help="output directory")
    export.add_argument("--force", action="store_true", help="replace --out if it exists")
    check = sub.add_parser("check", help="compare transformers' and megatron's logits; test the export round trip")
    check.add_argument("dir", help="a Hugging Face model directory")
    check.add_argument("--seq", type=int, default=32, help="tokens per sequence (default 32)")
    check.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.action == "init":
        from gyre_hpc.models.init import init_model

        sizes = {name: getattr(args, name) for name in DEFAULTS}
        out = init_model(args.arch, args.out, head_dim=args.head_dim, ffn=args.ffn, tie=args.tie,
                         overwrite=args.force, experts=args.experts, topk=args.topk, moe_ffn=args.moe_ffn, **sizes)
        print(f"gyre model init: wrote {out}")
        return 0
    if args.action == "export":
        from gyre_hpc.models.export import export

        print(f"gyre model export: wrote {export(args.source, args.out, overwrite=args.force)}")
        return 0
    from gyre_hpc.models.check import check_model

    report = check_model(args.dir, seq=args.seq)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>20}  {value}")
    return 0 if report["roundtrip_identical"] and report["max_abs_logit_diff"] <= 1e-4 else 1
