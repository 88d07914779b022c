"""One mini-swe-agent run (run as a script by the mini-swe-agent venv's ``python -I``): stdlib + minisweagent only.

``python -I mswea_runner.py SPEC.json`` (SPEC written by gyre_hpc/agents/mswea.py) builds the package's own
``DefaultAgent`` with its shipped ``mini.yaml`` prompts, a ``LitellmModel`` aimed at the run's endpoint
(``openai/<model>``, api_base = /runs/RUN/v1, api_key = the run key, no retries, cost tracking off), and a
``SandboxedEnvironment`` (a subclass of the package's ``LocalEnvironment``: the package stays unmodified), runs
the task, and writes ``RUN_DIR/result.json``: exit status, calls, and the commands the sandbox refused.

Invariants
- Every command runs as ``WRAP + ["/bin/sh", "-c", command]`` (WRAP = unshare + sandbox_launch.py when isolation
  is on) in the workspace, with the spec's command environment and timeout.
- result.json is written whenever the agent returns or raises; the trajectory JSON is rewritten after each step.
"""
import json
import shlex
import sys
from pathlib import Path

import yaml
from minisweagent import package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

#: Output that means the sandbox refused a command's write or connection (the run is marked).
REFUSED = {"Read-only file system": "write outside the workspace", "Network is unreachable": "network",
           "Temporary failure in name resolution": "network", "Cannot assign requested address": "network"}


class SandboxedEnvironment(LocalEnvironment):
    """The package's LocalEnvironment, each command prefixed by the sandbox wrapper; refusals are counted."""

    def __init__(self, *, wrap, **kwargs):
        super().__init__(**kwargs)
        self.wrap, self.refusals = list(wrap), []

    def execute(self, action, cwd="", *, timeout=None):
        command = action.get("command", "")
        if self.wrap:
            action = {**action, "command": shlex.join([*self.wrap, "/bin/sh", "-c", command])}
        return super().execute(action, cwd, timeout=timeout)

    def _check_finished(self, output):
        text = output.get("output", "") or ""
        self.refusals += [why for marker, why in REFUSED.items() if marker in text]
        super()._check_finished(output)


def main(spec_path):
    spec = json.loads(Path(spec_path).read_text())
    run_dir = Path(spec["run_dir"])
    cfg = yaml.safe_load((Path(package_dir) / "config" / "mini.yaml").read_text())
    model = LitellmModel(**{**cfg["model"], "model_name": spec["model"], "cost_tracking": "ignore_errors",
                            "model_kwargs": {**cfg["model"].get("model_kwargs", {}), "api_base": spec["base_url"], "api_key": spec["api_key"],
                                             "max_retries": 0}})
    env = SandboxedEnvironment(wrap=spec["wrap"], cwd=spec["workspace"], env=spec["command_env"],
                               timeout=int(max(1, spec["command_timeout_s"])))
    agent_cfg = {k: v for k, v in cfg["agent"].items() if k != "mode"}
    agent = DefaultAgent(model, env, **{**agent_cfg, "step_limit": spec["step_limit"], "cost_limit": 0,
                                        "output_path": run_dir / "trajectory.json"})
    result = {"exit_status": None, "steps": 0, "error": None}
    try:
        out = agent.run(spec["task"])
        result["exit_status"] = out.get("exit_status")
    except Exception as exc:  # noqa: BLE001 - reported to gyre in result.json; the run is "crashed"
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
    result.update(steps=agent.n_calls, refused=len(env.refusals), refusals=sorted(set(env.refusals)))
    (run_dir / "result.json").write_text(json.dumps(result))
    return 1 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
