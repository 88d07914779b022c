"""The policy side of an engine's sleep: ``release_weights`` really frees the tensors of the module (not copies),
and ``allocate_weights`` + ``load_weights(initial_state())`` gives back the seed's weights bit for bit (what a
woken engine that never loaded a weights directory reloads)."""
import pytest

from gyre_hpc.config import ModelConfig
from gyre_hpc.localengine.policy import MegatronPolicy

pytestmark = [pytest.mark.megatron]


def test_released_weights_hold_no_memory_and_come_back_bit_for_bit():
    policy = MegatronPolicy(ModelConfig(), seed=3, threads=1)
    checksum, logits = policy.checksum(), policy.next_token_logits([[1, 2, 3]])
    policy.release_weights()
    assert sum(p.numel() for p in policy.model.parameters()) == 0
    policy.allocate_weights()
    policy.load_weights(policy.initial_state())
    assert policy.checksum() == checksum
    assert (policy.next_token_logits([[1, 2, 3]]) == logits).all()
