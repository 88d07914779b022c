"""ZeRO-1's ownership rule (gyre_hpc.train.zero.owners): the same owner for every parameter on every replica, each
replica about 1/DP of the elements, every parameter owned once; and the checkpoint rule beside it: a checkpoint
resumes under the expert-parallel size that wrote it."""
import pytest

from gyre_hpc.train.zero import owners

pytestmark = [pytest.mark.megatron]  # imports torch

SIZES = [4096, 64, 64, 1024, 1024, 1024, 4096, 128, 1, 1, 2048, 2048]


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_every_parameter_has_one_owner_and_the_replicas_hold_about_equal_shares(replicas):
    got = owners(SIZES, replicas)
    assert len(got) == len(SIZES) and set(got) <= set(range(replicas))
    loads = [sum(n for n, o in zip(SIZES, got) if o == r) for r in range(replicas)]
    assert sum(loads) == sum(SIZES)
    assert max(loads) - min(loads) <= max(SIZES)  # greedy, largest first: within one parameter of each other


def test_the_rule_depends_only_on_the_sizes_so_every_replica_computes_the_same():
    assert owners(SIZES, 2) == owners(list(SIZES), 2)
    assert owners([8, 8, 8, 8], 2) == [0, 1, 0, 1]  # ties go to the lower replica, in parameter order


def test_more_replicas_than_parameters_leaves_some_replicas_without_moments():
    assert sorted(owners([10, 5], 4)) == [0, 1]


def test_a_checkpoint_resumes_only_under_the_expert_parallel_size_that_wrote_it(tmp_path):
    import json

    from gyre_hpc.errors import CheckpointError
    from gyre_hpc.train.checkpoint import check_expert_parallel

    (tmp_path / "meta.json").write_text(json.dumps({"version": 3, "expert_parallel": 2}))
    check_expert_parallel(tmp_path, 2)
    with pytest.raises(CheckpointError, match="written under train.expert_parallel=2, resumed under 1"):
        check_expert_parallel(tmp_path, 1)
