"""A rank of a batch script's step that fails at start with a config or layout error (exit 2) leaves
RUN_DIR/errors/rankN.txt, so the script's relaunch helper reads the step as an error, not as a rank lost while
starting (gyre_hpc/slurm/relaunch.py); outside a batch script's step nothing is written."""
from gyre_hpc import cli
from gyre_hpc.slurm.relaunch import errors_since


def test_a_batch_step_rank_that_fails_with_exit_2_leaves_its_error_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GYRE_SBATCH_LAUNCHED", "1")
    monkeypatch.setenv("SLURM_PROCID", "3")
    rc = cli.main(["train", "configs/local.yaml", "--run-dir", str(tmp_path), "--set", "cluster.cells=0"])
    assert rc == 2
    assert [p.name for p in errors_since(tmp_path, 0.0)] == ["rank3.txt"]
    assert "cluster.cells" in (tmp_path / "errors" / "rank3.txt").read_text()


def test_outside_a_batch_step_an_exit_2_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("GYRE_SBATCH_LAUNCHED", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert cli.main(["train", "configs/local.yaml", "--run-dir", str(tmp_path), "--set", "cluster.cells=0"]) == 2
    assert not (tmp_path / "errors").exists()
