"""``gyre serve``: engines + the proxy's OpenAI endpoint as one command, TITO flushed to a directory, no training.

Runs the real command (one local engine serving a tiny Qwen3 model) as a subprocess, talks to it with the
``openai`` client or, as README shows a newcomer, by pasting its printed export lines into bash and calling
``curl``; stops it with SIGTERM by its PID and reads the TITO file back.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from gyre_hpc.net import auth
from gyre_hpc.engines.launch import free_port
from gyre_hpc.models.init import init_model
from gyre_hpc.trajectory.records import read_tito

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _until_ready(proc: subprocess.Popen) -> list[str]:
    """The lines ``gyre serve`` printed up to and including its ready line."""
    lines = []
    while not lines or "gyre serve ready" not in lines[-1]:
        lines.append(proc.stdout.readline())
        assert lines[-1] or proc.poll() is None, "gyre serve exited before it was ready:\n" + "".join(lines)
    return lines


def _exports(lines: list[str]) -> dict[str, dict[str, str]]:
    """Per printed run (``# run RUN: ...``), its ``export NAME=VALUE`` lines."""
    runs, run = {}, None
    for line in lines:
        if line.startswith("# run "):
            run = line.split()[2].rstrip(":")
        elif line.startswith("export ") and run is not None:
            name, _, value = line[len("export "):].strip().partition("=")
            runs.setdefault(run, {})[name] = value
    return runs


def test_gyre_serve_answers_chat_calls_and_writes_their_tito(tmp_path):
    model = init_model("qwen3", tmp_path / "tiny")  # `gyre model init --arch qwen3` with its default arguments
    tito = tmp_path / "tito"
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "serve", str(ROOT / "configs" / "local.yaml"),
           "--port", str(free_port()), "--run", "q0-r0", "--run", "q0-r1",
           "--tito-dir", str(tito), "--flush-s", "0.5", "--set", f"model.hf_path={model}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = _until_ready(proc)
        ready = lines[-1]
        # local.yaml's vocab_size 512 yields to the checkpoint's 1024: one note, no conflict error
        assert [x for x in lines if "note:" in x] == [
            "gyre serve: note: model.hf_path's config.json wins over the config's model fields "
            "(vocab_size: config 512 -> checkpoint 1024)\n"]
        url = ready.split("url=")[1].split()[0]
        secret = Path(ready.split("secret=")[1].split()[0]).read_text().strip()
        printed = _exports(lines)
        assert list(printed) == ["q0-r0", "q0-r1"]
        for run in printed:  # an agent holds its run's key, never the server's secret
            assert printed[run] == {"OPENAI_BASE_URL": f"{url}/runs/{run}/v1",
                                    "OPENAI_API_KEY": auth.run_key(secret, run)}
        key = printed["q0-r0"]["OPENAI_API_KEY"]
        c = openai.OpenAI(base_url=f"{url}/runs/q0-r0/v1", api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "Fix the bug."}]
        for _ in range(2):
            msg = c.chat.completions.create(model="gyre-policy", messages=messages, max_tokens=8, temperature=0.0)
            messages += [msg.choices[0].message.model_dump(), {"role": "user", "content": "Again."}]
        other = openai.OpenAI(base_url=f"{url}/runs/q0-r1/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.PermissionDeniedError):  # another run's endpoint
            other.chat.completions.create(model="gyre-policy", messages=messages, max_tokens=8)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/runs/q0-r0/v1", api_key="wrong", max_retries=0).models.list()
        httpx.post(f"{url}/tito/outcome", json={"run_id": "q0-r0", "status": "scored", "score": 0.0},
                   headers=auth.bearer(key)).raise_for_status()
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    calls = read_tito(tito / "tito.jsonl").runs["q0-r0"]
    assert len(calls) == 2
    assert calls[1].input_ids[:len(calls[0].sequence)].tolist() == calls[0].sequence.tolist()


TOOLS = [{"type": "function", "function": {"name": "list_files", "description": "List the files of a directory",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}}}}}]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is installed by scripts/setup.sh")
def test_a_newcomer_pastes_the_printed_lines_and_curls_a_chat_call_with_tools_into_tito(tmp_path):
    """README's path: `gyre serve configs/local.yaml` with no other arguments (the tiny model written for it, the
    default run's lines printed), the lines pasted into a shell, a curl chat call with tools, its TITO record."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "gyre_hpc.cli", "serve", str(ROOT / "configs" / "local.yaml")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    body = {"model": "gyre-policy", "max_tokens": 8, "tools": TOOLS,
            "messages": [{"role": "user", "content": "What is in this directory?"}]}
    try:
        lines = _until_ready(proc)
        pasted = "".join(x for x in lines if x.startswith("export "))
        assert list(_exports(lines)) == ["run0"] and pasted.count("export ") == 2
        curl = ('curl -sS -w "\\n%{http_code}" "$OPENAI_BASE_URL/chat/completions" '
                '-H "Authorization: Bearer $OPENAI_API_KEY" -H "Content-Type: application/json" -d "$BODY"')
        shell = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}

        def call(script: str, data: dict = body) -> tuple[dict, int]:
            done = subprocess.run(["bash", "-c", script], env={**shell, "BODY": json.dumps(data)},
                                  capture_output=True, text=True, timeout=300)
            text, _, code = done.stdout.rpartition("\n")
            return json.loads(text), int(code)

        answer, code = call(pasted + curl)
        assert code == 200, answer
        assert answer["gyre"]["run_id"] == "run0" and answer["choices"][0]["message"]["role"] == "assistant"
        tokens_out = answer["usage"]["completion_tokens"]
        url = lines[-1].split("url=")[1].split()[0]  # the run's score, as an evaluation harness posts it
        scored, code = call(pasted + curl.replace("$OPENAI_BASE_URL/chat/completions", f"{url}/tito/outcome"),
                            {"run_id": "run0", "status": "scored", "score": 1.0})
        assert code == 200 and scored == {"run_id": "run0", "status": "scored"}
        # a key this server did not make (another server's secret): 401 that says how to get one, never 500
        foreign = auth.run_key("another server's secret", "run0")
        refused, code = call(pasted + f"export OPENAI_API_KEY={foreign}\n" + curl)
        assert code == 401
        message = refused["error"]["message"]
        assert "'run0'" in message and "gyre serve CONFIG --run RUN_ID" in message
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    tito = Path(lines[-1].split("tito=")[1].split()[0])
    assert tito.parent == tmp_path / "runs"
    log = read_tito(tito / "tito.jsonl")
    (call_,), (outcome,) = log.calls, log.outcomes
    assert (call_.run_id, len(call_.output_ids), len(call_.output_logprobs)) == ("run0", tokens_out, tokens_out)
    assert (outcome.run_id, outcome.score) == ("run0", 1.0)
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(tito / "model" / "init").decode(call_.input_ids.tolist())
    assert "list_files" in prompt and "What is in this directory?" in prompt  # the tools reached the model
