"""A real two-engine Mooncake pull prints none of Mooncake's start-up noise, unless GYRE_VERBOSE=1 (--verbose).

The publisher runs in a spawned child process, so the verbose case also shows the setting reaching children.
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.mooncake

PULL = textwrap.dedent("""
    from gyre_hpc.config import TransferConfig
    from gyre_hpc.transfer import make_puller
    from gyre_hpc.transfer.process import PublisherProcess

    CFG = TransferConfig(backend="mooncake", timeout_s=5, chunk_bytes=1 << 20, batch_bytes=2 << 20,
                         checksum_chunk_bytes=256 << 10)
    if __name__ == "__main__":
        with PublisherProcess(CFG) as pub, make_puller(CFG) as pull:
            _, stats = pull.pull(pub.publish(version=1, nbytes=1 << 20, seed=1))
            print("checksum_ok", stats.checksum_ok)
""")


def pull(tmp_path, verbose: bool) -> subprocess.CompletedProcess:
    script = tmp_path / "pull.py"
    script.write_text(PULL)
    env = {k: v for k, v in os.environ.items() if k != "GYRE_VERBOSE"}
    env.update({"GYRE_VERBOSE": "1"} if verbose else {})
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)


def test_a_normal_pull_prints_no_mooncake_noise(tmp_path):
    out = pull(tmp_path, verbose=False)
    assert out.returncode == 0 and out.stdout == "checksum_ok True\n", out.stderr
    assert "Local segment descriptor not found" not in out.stderr
    assert "InitGoogleLogging" not in out.stderr


def test_verbose_shows_it_in_both_processes(tmp_path):
    out = pull(tmp_path, verbose=True)
    assert out.returncode == 0 and out.stdout == "checksum_ok True\n", out.stderr
    assert out.stderr.count("Local segment descriptor not found") == 2  # the puller and the spawned publisher
