"""``gyre serve``: engines + the proxy's OpenAI endpoint as one command, TITO flushed to a directory, no training.

Runs the real command (one local engine serving a tiny ``gyre model init`` Qwen3 model) as a subprocess, talks to
it with the ``openai`` client, stops it with SIGTERM by its PID and reads the TITO file back.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from gyre_hpc import auth
from gyre_hpc.engines.launch import free_port
from gyre_hpc.models.init import init_model
from gyre_hpc.trajectory.records import read_tito

pytestmark = [pytest.mark.engine, pytest.mark.megatron, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_gyre_serve_answers_chat_calls_and_writes_their_tito(tmp_path):
    model = init_model("qwen3", tmp_path / "tiny", vocab=1024)
    tito = tmp_path / "tito"
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "serve", str(ROOT / "configs" / "swe_plugin.yaml"),
           "--port", str(free_port()),
           "--tito-dir", str(tito), "--flush-s", "0.5", "--set", f"model.hf_path={model}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = ""
        while "gyre serve ready" not in ready:
            ready = proc.stdout.readline()
            assert ready or proc.poll() is None, "gyre serve exited before it was ready"
        url = ready.split("url=")[1].split()[0]
        secret = Path(ready.split("secret=")[1].split()[0]).read_text().strip()
        key = auth.run_key(secret, "q0-r0")  # an agent holds its run's key, never the server's secret
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
