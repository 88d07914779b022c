"""``gyre tasks``: verify repository-repair task directories (docs/agents.md).

``check`` grades every task twice with the hidden-test grader, unmodified and with its reference patch, and
lists each task that does not score 0.0 and 1.0; the exit status is 1 if any does (2 for a malformed task dir).
"""
from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ThreadPoolExecutor

from gyre_hpc.agents.repo_tasks import load_tasks
from gyre_hpc.agents.task_check import check_task
from gyre_hpc.config import load_config
from jobs import add_overrides

DESCRIPTION = """\
gyre tasks check DIR [--json] [--jobs N]   unmodified repo scores 0.0, reference patch 1.0, for every task

Each task is DIR/<name>/ with task.yaml, repo/, hidden_tests.py and fix.patch (docs/agents.md). The grader
section of --config (or the defaults) sets the sandbox and its limits.
Examples:
  gyre tasks check tasks/
  gyre tasks check tasks/ --json --set grader.isolation=required
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="verify every task: unmodified scores 0.0, reference patch 1.0")
    check.add_argument("dir", help="tasks directory")
    check.add_argument("--json", action="store_true", help="print one JSON object: ok, failed, tasks")
    check.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="tasks checked at once")
    check.add_argument("--config", help="YAML config (its grader section is used; defaults when omitted)")
    add_overrides(check, "grader.timeout_s=30")


def run(args: argparse.Namespace) -> int:
    grader = load_config(args.config, args.overrides).grader
    tasks = load_tasks(args.dir)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        checks = list(pool.map(lambda t: check_task(t, grader), tasks))
    failed = [c.name for c in checks if not c.ok]
    if args.json:
        print(json.dumps({"ok": not failed, "failed": failed, "tasks": [c.to_json() for c in checks]}, indent=1))
    else:
        for c in checks:
            print(f"{'ok  ' if c.ok else 'FAIL'} {c.name}" + (f": {c.problem}" if c.problem else ""))
        print(f"{len(checks) - len(failed)}/{len(checks)} tasks pass"
              + (f" (isolation: {checks[0].to_json()['isolation']})" if checks else ""))
    return 1 if failed else 0
