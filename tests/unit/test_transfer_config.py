"""The transfer section: strict choices and bounds with dotted keys; the factories honour the backend."""
import pytest

from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.transfer import make_publisher, make_puller
from gyre_hpc.transfer.inprocess import InProcessPublisher, InProcessPuller


@pytest.mark.parametrize("override, message", [
    ("transfer.chunk_bytes=0", r"transfer\.chunk_bytes: must be >= 1, got 0"),
    ("transfer.timeout_s=0", r"transfer\.timeout_s: must be >= 1, got 0"),
    ("transfer.backend=nccl", r"transfer\.backend: 'nccl' is not one of 'mooncake', 'inprocess', 'socket'"),
    ("transfer.protocol=ib", r"transfer\.protocol: 'ib' is not one of 'tcp', 'rdma'"),
    ("transfer.host=''", r"transfer\.host: must be an address"),
])
def test_bad_transfer_values_name_the_dotted_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_factories_build_the_configured_backend():
    cfg = load_config(None, ["transfer.backend=inprocess"]).transfer
    with make_publisher(cfg) as publisher, make_puller(cfg) as puller:
        assert isinstance(publisher, InProcessPublisher) and isinstance(puller, InProcessPuller)
