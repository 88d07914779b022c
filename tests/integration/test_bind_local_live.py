"""The bind shim (gyre_hpc/native/bind_local.c) under the real listeners it exists for: Mooncake's P2P handshake
and transfer listeners, mpirun's own and Open MPI's TCP BTL (mpirun on one host, and srun --mpi=pmix on the local
SLURM cluster). Each listens on loopback only, and still works: a pull passes its checksums, the MPI world
wires up and reduces."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from slurm_cluster import local_slurm  # noqa: F401  (fixture)

from gyre_hpc.launcher.listen import batch_lines
from gyre_hpc.live import bind_local
from gyre_hpc.live.launch import mpirun_env
from gyre_hpc.launcher.openmpi import LOCAL_EXPORTS

WILDCARD = {"0.0.0.0", "::"}
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}

#: a Mooncake publisher (spawned child) and a puller (this process): one verified pull, then every TCP listener
MOONCAKE = textwrap.dedent("""
    import json, psutil
    from gyre_hpc.config import TransferConfig
    from gyre_hpc.transfer import make_puller
    from gyre_hpc.transfer.process import PublisherProcess, synthetic_weights

    CFG = TransferConfig(backend="mooncake", timeout_s=10, chunk_bytes=1 << 20, batch_bytes=2 << 20,
                         checksum_chunk_bytes=256 << 10)

    def main():
        with PublisherProcess(CFG) as pub, make_puller(CFG) as pull:
            got, _ = pull.pull(pub.publish(version=1, nbytes=4 << 20, seed=3))  # checksummed: TransferError if not
            same = all(got[k].tobytes() == v.tobytes() for k, v in synthetic_weights(4 << 20, 3).items())
            me = psutil.Process()
            listening = [c.laddr.ip for p in (me, *me.children(recursive=True))
                         for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
            print(json.dumps({"same": same, "listening": listening}))

    if __name__ == "__main__":
        main()
""")

#: every rank reduces and broadcasts 1 MiB (the BTL wires up), then lists the TCP listeners it opened itself (not
#: those it inherited: under srun every task holds slurmstepd's 0.0.0.0 listener from its start, SLURM's own,
#: which no setting of a task can move; docs/reliability.md); rank 0 also lists mpirun's (its parent:
#: single-host launch), and prints everything
MPI_PROBE = textwrap.dedent("""
    import json, os, psutil
    INHERITED = {c.fd for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    from mpi4py import MPI
    print("mpi-init-done", flush=True)
    w = MPI.COMM_WORLD
    total = w.allreduce(w.Get_rank() + 1)
    buf = bytearray(1 << 20) if w.Get_rank() else bytearray(b"x" * (1 << 20))
    w.Bcast(buf, root=0)
    def listening(p):
        return [c.laddr.ip for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
                and not (p.pid == os.getpid() and c.fd in INHERITED)]
    mine = {"rank": w.Get_rank(), "sum": total, "bcast": bytes(buf[:1]).decode(), "ips": listening(psutil.Process())}
    if w.Get_rank() == 0 and os.environ.get("PROBE_PARENT"):
        mine["mpirun"] = listening(psutil.Process(os.getppid()))
    everyone = w.gather(mine)
    if w.Get_rank() == 0:
        print(json.dumps(everyone), flush=True)
""")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    built = bind_local.library(cache=tmp_path_factory.mktemp("cache"))
    assert built is not None
    return built


@pytest.mark.mooncake
@pytest.mark.slow
def test_mooncakes_listeners_bind_loopback_and_a_pull_still_passes_its_checksums(lib, tmp_path):
    script = tmp_path / "mooncake_probe.py"
    script.write_text(MOONCAKE)
    env = {**os.environ, **bind_local.preload_env(os.environ, "lo", lib)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["same"] is True
    assert len(got["listening"]) >= 4  # the handshake's and the transfer's, in each of the two engines
    assert set(got["listening"]) <= LOOPBACK, got["listening"]


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("btl", ["self,vader", "self,tcp"])  # gyre train's; the TCP BTL of the srun path
def test_mpirun_and_the_tcp_btl_listen_on_loopback_and_the_world_still_wires_up(lib, tmp_path, monkeypatch, btl):
    monkeypatch.setattr(bind_local, "library", lambda: lib)
    prog = tmp_path / "mpi_probe.py"
    prog.write_text(MPI_PROBE)
    env = {**mpirun_env("lo"), "OMPI_MCA_btl": btl, "PROBE_PARENT": "1"}
    out = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2", sys.executable, str(prog)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    ranks = json.loads([line for line in out.stdout.splitlines() if line.startswith("[")][-1])
    assert [(r["sum"], r["bcast"]) for r in ranks] == [(3, "x"), (3, "x")]
    ips = ranks[0]["mpirun"] + [ip for r in ranks for ip in r["ips"]]
    assert ranks[0]["mpirun"] and set(ips) <= LOOPBACK, ips
    if btl == "self,tcp":
        assert all(r["ips"] for r in ranks)  # the TCP BTL listens, on loopback


@pytest.mark.slurm
@pytest.mark.mpi
def test_srun_hands_the_shim_to_its_tasks_and_their_tcp_btl_listens_on_loopback(local_slurm, tmp_path):
    """The batch lines the renderers write (gyre_hpc.launcher.listen.batch_lines), then one pmix world across 2 nodes."""
    from test_local_cluster import mpi_sbatch

    prog = tmp_path / "mpi_probe.py"
    prog.write_text(MPI_PROBE)
    exports = [f"export {e}" for e in LOCAL_EXPORTS] + [f"export XDG_CACHE_HOME={tmp_path / 'cache'}"]
    body = "\n".join(exports + batch_lines("lo", sys.executable) + [
        'echo "srun-preload=${LD_PRELOAD:-unset}"',
        f"srun --mpi=pmix --kill-on-bad-exit=1 {sys.executable} {prog}"])
    run = mpi_sbatch(tmp_path, body, 2, "-N2", "--ntasks-per-node=1")
    assert run.returncode == 0, run.output
    assert "srun-preload=unset" in run.output  # the batch shell (and srun) never load it
    ranks = json.loads([line for line in run.lines() if line.startswith("[")][-1])
    assert [r["sum"] for r in ranks] == [3, 3]
    ips = [ip for r in ranks for ip in r["ips"]]
    assert all(r["ips"] for r in ranks) and set(ips) <= LOOPBACK, ips
