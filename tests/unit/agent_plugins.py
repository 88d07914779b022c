"""Plugin doubles for test_agent_plugins.py: agents and graders written the way a user would write them.

Run as a script it is a command agent: ``python agent_plugins.py PATCH [--exit N] [--sleep S]`` dumps its
environment and working directory to ``agent_env.json`` in its cwd, applies PATCH with ``patch -p1``, then sleeps
and exits as asked.
"""
import asyncio
import json
import os
import subprocess
import sys
import time

NOT_CALLABLE = 3


def _fix(task, workspace):
    subprocess.run(["patch", "-p1", "--batch", "-i", str(task.patch)], cwd=workspace, check=True, capture_output=True)


def fixing_agent(task, base_url, api_key, workspace):
    (workspace / "seen.json").write_text(json.dumps({"task": task.name, "base_url": base_url, "api_key": api_key}))
    _fix(task, workspace)


async def async_fixing_agent(task, base_url, api_key, workspace):
    await asyncio.sleep(0)
    _fix(task, workspace)
    return "done"


def crashing_agent(task, base_url, api_key, workspace):
    raise RuntimeError("the harness crashed")


async def hanging_agent(task, base_url, api_key, workspace):
    await asyncio.sleep(3600)


def grade_full(task, workspace):
    return 1.0


def grade_partial(task, workspace):
    return 0.25


def grade_raising(task, workspace):
    raise ValueError("grader bug")


def grade_hanging(task, workspace):
    time.sleep(10)
    return 1.0


def grade_out_of_range(task, workspace):
    return 1.5


if __name__ == "__main__":
    patch, args = sys.argv[1], sys.argv[2:]
    with open("agent_env.json", "w") as f:
        json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, f)
    subprocess.run(["patch", "-p1", "--batch", "-i", patch], check=True, capture_output=True)
    if "--sleep" in args:
        time.sleep(float(args[args.index("--sleep") + 1]))
    sys.exit(int(args[args.index("--exit") + 1]) if "--exit" in args else 0)
