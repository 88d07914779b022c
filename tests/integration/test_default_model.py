"""The embedded default's model (configs/local.yaml): RUN_DIR/model/init is a real Qwen3 directory with a context of
at least 4096 tokens that transformers loads and megatron computes alike; the trainer and every engine kind are
pointed at it; a second materialise (a resume) reuses it, byte for byte and untouched."""
import json

import pytest
import torch

from gyre_hpc.config import load_config
from gyre_hpc.models import run_init

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

CONFIG = "configs/local.yaml"
TOL = 1e-4  # float32 logits, as `gyre model check`


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield run_init.cache_root()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, cache):
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("run")
    assert run_init.materialise(load_config(CONFIG), run) == run_init.init_dir(run)
    return run


def test_the_initial_model_is_a_qwen3_checkpoint_with_a_4096_token_context(run_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(CONFIG)
    path = run_init.init_dir(run_dir)
    hf = json.loads((path / "config.json").read_text())
    assert hf["architectures"] == ["Qwen3ForCausalLM"] and hf["max_position_embeddings"] >= 4096
    assert hf["vocab_size"] == cfg.model.vocab_size
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    tok = AutoTokenizer.from_pretrained(str(path))
    assert len(tok) == cfg.model.vocab_size and tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "fix the test"}], tokenize=False)
    assert "<|im_start|>user" in text


def test_megatron_computes_the_logits_transformers_computes_and_export_gives_it_back(run_dir):
    from gyre_hpc.models.check import check_model

    report = check_model(run_init.init_dir(run_dir))
    assert report["arch"] == "Qwen3ForCausalLM"
    assert report["max_abs_logit_diff"] <= TOL
    assert report["roundtrip_identical"] is True


def test_the_trainer_and_every_engine_kind_load_the_initial_directory(run_dir):
    path = str(run_init.init_dir(run_dir).resolve())
    cfg = load_config(CONFIG)
    local = run_init.for_run(cfg, run_dir)
    assert local.model.hf_path == path and local.engine.model_path is None  # the local engine builds from hf_path
    assert {k: getattr(local.model, k) for k in ("vocab_size", "hidden", "layers", "heads", "max_seq_len")} == \
        {k: getattr(cfg.model, k) for k in ("vocab_size", "hidden", "layers", "heads", "max_seq_len")}
    sglang = run_init.for_run(load_config(CONFIG, ["engine.kind=sglang"]), run_dir)
    assert sglang.model.hf_path == path and sglang.engine.model_path == path
    assert run_init.for_run(local, run_dir) == local  # resolving twice changes nothing


def test_the_local_engine_policy_holds_the_directory_weights(run_dir):
    from gyre_hpc.localengine.policy import MegatronPolicy
    from gyre_hpc.models.check import hf_logits, megatron_logits, sample_ids

    cfg = run_init.for_run(load_config(CONFIG), run_dir)
    policy = MegatronPolicy(cfg.model, seed=cfg.run.seed + 1, threads=1)  # another seed: the weights are the file's
    ids, pos = sample_ids(cfg.model, 1, 16, seed=3)
    diff = (megatron_logits(policy.model, ids, pos) - hf_logits(cfg.model.hf_path, ids, pos)).abs().max().item()
    assert diff <= TOL


def test_a_second_materialise_reuses_the_directory_untouched(run_dir):
    path = run_init.init_dir(run_dir)
    before = {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in path.iterdir()}
    assert run_init.materialise(load_config(CONFIG), run_dir) == path
    assert {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in path.iterdir()} == before


def test_the_cached_copy_is_what_init_model_writes_and_a_second_run_takes_it_from_the_cache(run_dir, cache,
                                                                                            tmp_path):
    from gyre_hpc.models.init import init_model

    cfg = load_config(CONFIG)
    fresh = init_model("qwen3", tmp_path / "fresh", **run_init.init_args(cfg))
    first = {f.name: f.read_bytes() for f in run_init.init_dir(run_dir).iterdir()}
    assert {f.name: f.read_bytes() for f in fresh.iterdir()} == first
    assert [d.name for d in cache.iterdir()] == [run_init.cache_key(run_init.init_args(cfg))]
    second = run_init.materialise(cfg, tmp_path / "run2")
    assert {f.name: f.read_bytes() for f in second.iterdir()} == first
    assert len(list(cache.iterdir())) == 1  # no second entry: the same key


def test_another_seed_is_another_model():
    a, b = load_config(CONFIG), load_config(CONFIG, ["run.seed=1"])
    assert run_init.cache_key(run_init.init_args(a)) != run_init.cache_key(run_init.init_args(b))


class BcastDouble:
    """The data communicator at its boundary: records broadcasts (a real one makes rank 1 wait for rank 0)."""

    def __init__(self):
        self.calls = 0

    def bcast(self, obj, root=0):
        self.calls += 1
        return obj


def test_ranks_started_without_the_launcher_share_the_one_that_rank_0_writes(run_dir, cache, tmp_path):
    from gyre_hpc.live.rank import _shared_initial_model

    cfg = load_config(CONFIG)
    comms = [BcastDouble(), BcastDouble()]
    got = [_shared_initial_model(cfg, tmp_path, comms[rank], rank) for rank in (0, 1)]
    assert got[0] == got[1] == run_init.for_run(cfg, tmp_path)
    assert got[0].model.hf_path == str(run_init.init_dir(tmp_path).resolve())
    assert [c.calls for c in comms] == [1, 1]  # every rank takes the same branch: one broadcast each
    plain = load_config(CONFIG, ["model.qk_layernorm=false", "model.vocab_size=256"])
    assert _shared_initial_model(plain, tmp_path / "plain", comms[1], 1) is plain and comms[1].calls == 1
