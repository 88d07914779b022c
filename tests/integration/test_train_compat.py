"""cpu_compat against the pinned megatron-core, and the collation of PackedBatch into tensors."""
import numpy as np
import pytest
import torch

from train_batches import fork_pair

pytestmark = pytest.mark.megatron
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the patches apply only without CUDA")


@pytest.fixture(scope="module")
def compat():
    from gyre_hpc.train import cpu_compat
    from gyre_hpc.train.model import quiet_megatron

    with quiet_megatron():
        cpu_compat.apply()
    return cpu_compat


def test_pinned_megatron_still_has_every_private_name_we_patch(compat):
    compat.check()


def test_check_fails_loudly_on_another_version_or_a_missing_name(compat, monkeypatch):
    import megatron.core
    from megatron.core.tensor_parallel import random as mrandom

    monkeypatch.setattr(megatron.core, "__version__", "0.17.0")
    with pytest.raises(RuntimeError, match="written for megatron-core 0.16.1, found 0.17.0"):
        compat.check()
    monkeypatch.undo()
    monkeypatch.delattr(mrandom, "_CUDA_RNG_STATE_TRACKER")
    with pytest.raises(RuntimeError, match=r"random\._CUDA_RNG_STATE_TRACKER is gone"):
        compat.check()


@cpu_only
def test_apply_redirects_every_cuda_path_to_the_cpu(compat):
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import get_cuda_rng_tracker
    from megatron.core.utils import GlobalMemoryBuffer

    assert torch.cuda.current_device() == torch.device("cpu")
    torch.cuda.synchronize()
    assert GlobalMemoryBuffer().get_tensor((2, 3), torch.float32, "mpu").device.type == "cpu"
    assert isinstance(get_cuda_rng_tracker(), compat.CpuRNGStatesTracker)
    mask = fused_softmax.get_default_causal_mask(3)
    assert mask.device.type == "cpu" and mask.tolist() == [[False, True, True], [False, False, True], [False] * 3]


@cpu_only
def test_apply_is_idempotent(compat):
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    assert compat.apply() is True and compat.apply() is True
    assert get_cuda_rng_tracker() is tracker


def test_rng_tracker_forks_continue_a_named_stream_and_restore_the_caller(compat):
    tracker = compat.CpuRNGStatesTracker()
    tracker.add("stream", 7)
    reference = torch.Generator().manual_seed(7)
    want = torch.rand(6, generator=reference)
    torch.manual_seed(123)
    outside = torch.get_rng_state()
    with tracker.fork("stream"):
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outside)
    with tracker.fork("stream"):
        second = torch.rand(3)
    assert torch.equal(torch.cat([first, second]), want)
    with pytest.raises(Exception, match="seed 7 already exists"):
        tracker.add("other", 7)
    with pytest.raises(Exception, match="not added"):
        with tracker.fork("missing"):
            pass


def test_collated_mask_is_the_negated_tree_attention(compat):
    from gyre_hpc.trajectory.collate import to_tensors

    tree, flat = fork_pair([(2, 3, [2, 3, 1], 1.0), (1, 4, [2, 2], -0.5)], seed=0)
    for batch in (tree, flat):
        t = to_tensors(batch)
        R, L = batch.shape
        assert t["attention_mask"].shape == (R, 1, L, L) and t["attention_mask"].dtype == torch.bool
        for r in range(R):
            assert np.array_equal(t["attention_mask"][r, 0].numpy(), ~batch.attention_allowed(r))
        assert not t["attention_mask"].diagonal(dim1=2, dim2=3).any()  # every position attends itself
    assert t["input_ids"].dtype == torch.int64 and t["loss_mask"].dtype == torch.float32
    before = flat.input_ids.copy()
    t["input_ids"].add_(1)  # tensors are copies: the batch is untouched
    assert np.array_equal(flat.input_ids, before)
