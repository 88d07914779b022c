"""gyre_hpc.train.adamw.AdamW updates exactly as torch.optim.AdamW does and shares its state_dict format (that it
imports no torch._dynamo: tests/integration/test_megatron_import.py)."""
import pytest
import torch

from gyre_hpc.train.adamw import AdamW


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=g)) for shape in ((5, 3), (7,), (2, 2, 2))]


def _grads(params, step: int, skip: int | None):
    g = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(params):
        p.grad = None if i == skip else torch.randn(p.shape, generator=g)


def test_updates_and_state_are_bit_identical_to_torch_adamw_including_skipped_parameters():
    ours, theirs = _params(0), _params(0)
    kw = dict(lr=3e-3, betas=(0.8, 0.95), weight_decay=0.1)
    a, b = AdamW(ours, **kw), torch.optim.AdamW(theirs, **kw)
    for step in range(6):
        skip = 1 if step in (2, 3) else None  # a parameter without a gradient is skipped, its state kept
        _grads(ours, step, skip)
        _grads(theirs, step, skip)
        a.step()
        b.step()
        a.zero_grad(set_to_none=True)
        b.zero_grad(set_to_none=True)
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q) and p.grad is None
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for i in sb["state"]:
        for k, v in sb["state"][i].items():
            assert torch.equal(sa["state"][i][k], v) and sa["state"][i][k].dtype == v.dtype


@pytest.mark.parametrize("source", ["ours", "torch"])
def test_a_saved_state_of_either_optimizer_resumes_to_the_same_weights(source):
    kw = dict(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
    first = _params(1)
    opt = AdamW(first, **kw) if source == "ours" else torch.optim.AdamW(first, **kw)
    for step in range(3):
        _grads(first, step, None)
        opt.step()
    saved = opt.state_dict()
    resumed, reference = [p.detach().clone().requires_grad_() for p in first], first
    again = AdamW(resumed, **kw)
    again.load_state_dict(saved)
    for step in range(3, 5):
        _grads(resumed, step, None)
        _grads(reference, step, None)
        again.step()
        opt.step()
    for p, q in zip(resumed, reference):
        assert torch.equal(p, q)


def test_a_state_for_another_number_of_parameters_is_refused():
    opt = AdamW(_params(0), lr=1e-3)
    with pytest.raises(ValueError, match="optimizer state for 2 parameters, this model has 3"):
        opt.load_state_dict({"state": {}, "param_groups": [{"params": [0, 1]}]})


def test_zero_grad_without_set_to_none_keeps_zeroed_gradients():
    params = _params(0)
    _grads(params, 0, None)
    AdamW(params, lr=1e-3).zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in params)

