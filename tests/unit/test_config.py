"""Config loading: strict keys and types with dotted paths, typed --set overrides, documented fields."""
import pytest

from gyre_hpc.config import GyreConfig, apply_overrides, explain, load_config, to_dict
from gyre_hpc.errors import ConfigError


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_load_and_are_frozen():
    cfg = load_config(None)
    assert isinstance(cfg, GyreConfig)
    with pytest.raises(Exception):
        cfg.trajectory.j_max = 3  # frozen


def test_unknown_key_names_dotted_path_and_valid_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key trajectory\.jmax; valid keys of trajectory: j_max"):
        load_config(write(tmp_path, "trajectory:\n  jmax: 3\n"))


def test_wrong_type_names_dotted_path(tmp_path):
    with pytest.raises(ConfigError, match=r"run\.seed: expected an integer, got 'x'"):
        load_config(write(tmp_path, "run:\n  seed: x\n"))


def test_bool_is_not_an_integer(tmp_path):
    with pytest.raises(ConfigError, match=r"run\.seed"):
        load_config(write(tmp_path, "run:\n  seed: true\n"))


def test_section_check_failure_is_dotted():
    with pytest.raises(ConfigError, match=r"trajectory\.j_max: must be >= 1 or null, got 0"):
        load_config(None, ["trajectory.j_max=0"])


def test_overrides_are_typed_yaml_scalars():
    assert load_config(None, ["trajectory.j_max=null"]).trajectory.j_max is None
    assert load_config(None, ["trajectory.j_max=3"]).trajectory.j_max == 3
    with pytest.raises(ConfigError, match="expected int | null"):
        load_config(None, ["trajectory.j_max=three"])


def test_override_of_unknown_section_lists_root_keys():
    with pytest.raises(ConfigError, match=r"unknown key traj; valid keys of the root: run, cluster, trajectory"):
        apply_overrides({}, ["traj.j_max=1"])


def test_malformed_override_is_rejected():
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(None, ["trajectory.j_max"])


def test_missing_file_and_bad_yaml_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: invalid YAML"):
        load_config(write(tmp_path, "run:\n  name: [unclosed\nseed: 1\n"))


def test_every_field_is_documented():
    rows = explain()
    assert rows and all(doc for _, _, _, doc in rows)


def test_to_dict_round_trips():
    cfg = load_config(None, ["trajectory.j_max=2", "run.seed=7"])
    assert load_config(None, [f"{k}={v}" for k, v in [("trajectory.j_max", 2), ("run.seed", 7)]]) == cfg
    assert to_dict(cfg)["trajectory"]["j_max"] == 2


def test_exponent_floats_without_dot_are_numbers():
    assert load_config(None, ["train.lr=1e-5"]).train.lr == 1e-5
    with pytest.raises(ConfigError, match=r"train\.lr: expected a number"):
        load_config(None, ["train.lr=fast"])


def test_epochs_above_one_need_the_ppo_loss_and_the_retired_train_mu_is_unknown():
    assert load_config(None, ["train.loss=ppo", "train.epochs=4"]).train.epochs == 4
    with pytest.raises(ConfigError, match=r"train\.epochs: 4 updates per batch .* set train\.loss: ppo"):
        load_config(None, ["train.loss=pg", "train.epochs=4"])
    with pytest.raises(ConfigError, match=r"train\.epochs: must be >= 1, got 0"):
        load_config(None, ["train.epochs=0"])
    with pytest.raises(ConfigError, match=r"unknown key train\.mu; valid keys of train: .*epochs"):
        load_config(None, ["train.mu=2"])
