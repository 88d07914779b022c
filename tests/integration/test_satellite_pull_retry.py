"""A satellite pull whose checksum fails is retried, up to ``transfer.checksum_retries`` times, before it is fatal
(gyre_hpc/live/training_side.py ``SatelliteTrainer.ensure``). The core publishes for real (in-process transfer); the
damage is a double around the real puller that reports a checksum mismatch for its first pulls."""
import pytest

from gyre_hpc.config import load_config
from gyre_hpc.errors import TransferError

pytestmark = [pytest.mark.megatron, pytest.mark.slow]


class DamagingPullerDouble:
    """The real puller, except that its first ``damaged`` pulls fail verification as a corrupted read would."""

    def __init__(self, real, damaged: int):
        self.real, self.damaged, self.calls = real, damaged, 0

    def pull(self, descriptor):
        self.calls += 1
        if self.calls <= self.damaged:
            raise TransferError(f"checksum mismatch in 1 of 4 chunks (first: chunk 0) of version "
                                f"{descriptor.version} from {descriptor.location}; damaged tensors: w")
        return self.real.pull(descriptor)

    def close(self):
        self.real.close()


@pytest.fixture(scope="module")
def core_and_satellite(tmp_path_factory):
    from gyre_hpc.live.training_side import CoreTrainer, SatelliteTrainer

    run_dir = tmp_path_factory.mktemp("run")
    cfg = load_config("configs/local.yaml", ["transfer.backend=inprocess", "transfer.checksum_retries=2"])
    sections = dict(model=cfg.model, train=cfg.train, transfer=cfg.transfer, seed=cfg.run.seed)
    core = CoreTrainer(run_dir, **sections)
    satellite = SatelliteTrainer(run_dir, **sections, slots=cfg.scheduler.batch_groups)
    yield core, satellite
    satellite.close()
    core.close()


@pytest.mark.parametrize("damaged,ok", [(2, True), (3, False)])
def test_a_checksum_failure_is_retried_a_bounded_number_of_times(core_and_satellite, damaged, ok):
    core, satellite = core_and_satellite
    satellite.version = -1
    real = satellite.puller
    satellite.puller = DamagingPullerDouble(real, damaged)
    before = len(satellite.pull_retries)
    try:
        if ok:
            rec = satellite.ensure(0, timeout_s=30)
            assert rec["version"] == 0 and rec["checksum_ok"] is True and satellite.version == 0
        else:
            with pytest.raises(TransferError, match="checksum mismatch"):
                satellite.ensure(0, timeout_s=30)
        assert satellite.puller.calls == min(damaged + 1, 3)
        assert len(satellite.pull_retries) - before == 2
    finally:
        satellite.puller = real
