"""``gyre config``: explain every key (type, default, doc) or print a resolved config as YAML."""
from __future__ import annotations

import argparse

import yaml

from gyre_hpc.config import explain, load_config, to_dict
from jobs import add_overrides


DESCRIPTION = """\
gyre config explain            every key with its type, default and meaning
gyre config show CONFIG        the config after defaults and --set overrides, as YAML

Examples:
  gyre config explain | grep trajectory
  gyre config show configs/local.yaml --set trajectory.j_max=null
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["explain", "show"], help="what to print")
    p.add_argument("config", nargs="?", help="YAML config (for show; defaults when omitted)")
    add_overrides(p, "trajectory.j_max=3")


def run(args: argparse.Namespace) -> int:
    if args.action == "explain":
        for key, tp, default, doc in explain():
            if tp == "section":
                print(f"\n[{key}]  {doc}")
            else:
                print(f"  {key:<40} {tp:<28} default {default:<10} {doc}")
        return 0
    cfg = load_config(args.config, args.overrides)
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0
