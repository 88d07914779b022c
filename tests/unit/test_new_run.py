"""A new run's directory holds its config resolved before any rank starts (``run_init.new_run``, used by gyre train,
gyre submit, gyre sweep and ``gyre_hpc.slurm.submit``): a job that SLURM requeues loads RUN_DIR/config.yaml and
its resume check accepts it. Before, gyre submit wrote the config with ``model.hf_path: null`` and rank 0 wrote
RUN_DIR/model/init later, so the requeued job's check saw ``model.hf_path`` change and refused to resume."""
import pytest

from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.lifecycle import resume
from gyre_hpc.live.rank import check_resume_config
from gyre_hpc.models import run_init
from gyre_hpc.rundir import RunDir

CONFIG = "configs/local.yaml"


def _requeued_check(run_dir):
    """What a requeued job's rank does first: load RUN_DIR/config.yaml, resolve it, check it against the run's."""
    (run_dir / resume.DIR).mkdir()
    (run_dir / resume.DIR / resume.STATE).write_text("{}")
    loaded = load_config(str(RunDir(run_dir).config_path))
    check_resume_config(run_init.for_run(loaded, run_dir), run_dir)


def test_a_submitted_run_holds_its_resolved_config_and_a_requeued_job_resumes_it(tmp_path):
    cfg = load_config(CONFIG, [f"run.out_dir={tmp_path}"])
    run_dir, resolved = run_init.new_run(cfg, "gyre submit", absolute=True)
    assert resolved.model.hf_path == str(run_init.init_dir(run_dir).resolve())
    assert RunDir(run_dir).read_config() == resolved
    _requeued_check(run_dir)  # accepted: no ConfigError


def test_a_config_written_before_the_initial_model_is_refused_at_the_requeue(tmp_path):
    """The old order, kept as the reason for the new one: the check is real and sees the difference."""
    cfg = load_config(CONFIG)
    rundir = RunDir.at(tmp_path / "run")
    rundir.write_config(cfg)
    run_init.materialise(cfg, rundir.path)
    with pytest.raises(ConfigError, match="model.hf_path"):
        _requeued_check(rundir.path)


def test_a_sweep_element_directory_is_used_as_given(tmp_path):
    cfg = load_config(CONFIG)
    run_dir, resolved = run_init.new_run(cfg, "gyre sweep", path=tmp_path / "e000")
    assert run_dir == tmp_path / "e000" and (run_dir / "config.yaml").is_file()
    assert run_init.init_dir(run_dir).is_dir() and resolved.model.hf_path is not None


def test_a_new_run_whose_initial_model_cannot_be_written_leaves_no_directory(tmp_path, monkeypatch):
    def refuse(cfg, run_dir):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_init, "materialise", refuse)
    cfg = load_config(CONFIG, [f"run.out_dir={tmp_path}"])
    with pytest.raises(OSError):
        run_init.new_run(cfg, "gyre train")
    assert list(tmp_path.iterdir()) == []
