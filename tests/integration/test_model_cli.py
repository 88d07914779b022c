"""``gyre model init / check / export`` as a user runs them: real files, real transformers, exit codes."""
import json

import pytest

from gyre_hpc.cli import main

pytestmark = [pytest.mark.megatron, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny"
    assert main(["model", "init", "--arch", "qwen3", "--out", str(out), "--vocab", "400", "--context", "512",
                 "--seed", "2"]) == 0
    return out


def test_init_is_deterministic_for_a_seed(tiny, tmp_path):
    again = tmp_path / "again"
    assert main(["model", "init", "--arch", "qwen3", "--out", str(again), "--vocab", "400", "--context", "512",
                 "--seed", "2"]) == 0
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (tiny / name).read_bytes(), name


def test_tokenizer_has_the_vocab_size_round_trips_text_and_renders_tool_calls(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    assert len(tok) == 400 == json.loads((tiny / "config.json").read_text())["vocab_size"]
    text = "def f(x):\n    return x  # ünïcödé 日本\t<tool_call>{\"a\": 1}</tool_call><|im_end|>"
    assert tok.decode(tok.encode(text)) == text
    assert tok.convert_tokens_to_ids("<tool_call>") != tok.unk_token_id
    msgs = [{"role": "user", "content": "list files"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "bash", "arguments": {"cmd": "ls"}}}]},
            {"role": "tool", "content": "a.py"}]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    prompt = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
    assert '<tools>\n{"type": "function"' in prompt
    assert '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>' in prompt
    assert "<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_check_prints_the_json_report_and_leaves_the_directory_as_it_was(tiny, capsys):
    before = {f.name: f.read_bytes() for f in tiny.iterdir()}
    assert main(["model", "check", str(tiny), "--json"]) == 0
    assert {f.name: f.read_bytes() for f in tiny.iterdir()} == before
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report) == {"arch", "params", "max_abs_logit_diff", "roundtrip_identical"}
    assert report["arch"] == "Qwen3ForCausalLM" and report["roundtrip_identical"] is True
    assert report["max_abs_logit_diff"] <= 1e-4 and report["params"] > 0


def test_init_refuses_an_existing_directory_without_force(tiny, capsys):
    assert main(["model", "init", "--arch", "qwen2", "--out", str(tiny)]) == 2
    assert "exists" in capsys.readouterr().err


def test_check_refuses_an_unsupported_architecture_by_name(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert main(["model", "check", str(tmp_path)]) == 2
    assert "'LlamaForCausalLM'" in capsys.readouterr().err


def test_train_refuses_an_hf_path_of_an_unsupported_architecture_by_name_listing_the_supported(tmp_path, capsys):
    from pathlib import Path

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    config = Path(__file__).resolve().parents[2] / "configs" / "local.yaml"
    assert main(["train", str(config), "--set", f"model.hf_path={tmp_path}",
                 "--set", f"run.out_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert ("gyre train: error: model.hf_path: architecture ['LlamaForCausalLM'] is not supported; "
            "supported: Qwen2ForCausalLM, Qwen3ForCausalLM") in err
    assert not (tmp_path / "runs").exists()  # refused before any run directory or rank


def test_export_refuses_a_run_of_the_builtin_random_model(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("model:\n  hidden: 64\n")
    (tmp_path / "checkpoints" / "latest").mkdir(parents=True)
    assert main(["model", "export", str(tmp_path), "--out", str(tmp_path / "hf")]) == 2
    assert "model.hf_path: null" in capsys.readouterr().err
