"""A satellite whose run ends while its gradient message is still unread by the core must keep the message's
buffer until the core has taken it (``dataplane.settle``): Open MPI's shared-memory transport reads a large
message from the sender's memory at the receive. CI saw the core fail with ``UnpicklingError`` at the end of live
runs when the satellite's runner (and its pending send) was freed first. Real mpirun, two ranks, default BTLs."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_cluster import mpirun, mpirun_env  # noqa: F401  (fixture)

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.mpi


def test_a_message_whose_sender_ends_before_the_receive_arrives_whole(mpirun):
    out = subprocess.run([mpirun, "--oversubscribe", "-n", "2", sys.executable, str(HERE / "mpi_settle_job.py")],
                         capture_output=True, text=True, env=mpirun_env(), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {d["rank"]: d for d in map(json.loads, filter(str.strip, out.stdout.splitlines()))}
    assert lines[0]["whole"] is True and lines[1]["settled"] is True
