"""gyre_hpc.tracking.plan: stable metric names, the event window, role shares, the resume reconcile."""
import math
from pathlib import Path

LOCAL = Path(__file__).resolve().parents[2] / "configs" / "local.yaml"

from gyre_hpc.tracking import plan


def test_step_metrics_use_the_stable_names_and_leave_out_missing_values():
    rec = {"step": 3, "reward": 0.5, "reward_std": None, "staleness_max": 2, "trained_tokens": 100,
           "logprob_abs_diff_mean": float("nan"), "flag": True}
    m = plan.step_metrics(rec)
    assert m == {"reward/mean": 0.5, "staleness/max": 2.0, "tokens/trained": 100.0}
    assert set(m) <= set(plan.METRICS)


def test_event_window_means_switch_phases_and_counts_lost_groups_then_resets():
    w = plan.EventWindow()
    w.add({"event": "switch_done", "timing": {"drain_s": 1.0, "engine_stop_s": 2.0}, "total_s": 3.0})
    w.add({"event": "switch_done", "timing": {"drain_s": 3.0}, "total_s": 5.0})
    w.add({"event": "group_lost", "gid": 4})
    w.add({"event": "train_step"})
    assert w.take() == {"groups/lost": 1.0, "switch_s/total": 4.0, "switch_s/drain": 2.0, "switch_s/engine_stop": 2.0}
    assert w.take() == {"groups/lost": 0.0}


def test_role_shares_integrate_cell_time_between_steps():
    r = plan.RoleShares()
    r.observe(0.0, {"rollout": 4, "train": 0})
    r.observe(10.0, {"rollout": 2, "train": 2})
    shares = r.take(20.0)  # 40 + 20 rollout cell-seconds, 20 train
    assert math.isclose(shares["role_share/rollout"], 0.75) and math.isclose(shares["role_share/train"], 0.25)
    assert math.isclose(sum(r.take(30.0).values()), 1.0)  # the next step starts where this one ended


def test_reconcile_resends_kept_steps_not_taken_and_purges_steps_trained_again():
    kept = [{"step": s} for s in (1, 2, 3)]
    assert plan.reconcile(kept, 3) == (None, [])
    assert plan.reconcile(kept, 1) == (None, [{"step": 2}, {"step": 3}])  # buffered when the segment ended
    assert plan.reconcile(kept, 5) == (4, [])  # rank 0 died after step 5, the resume state holds 3
    assert plan.reconcile([], 2) == (1, [])


def test_flat_params_and_flat_numbers():
    assert plan.flat_params({"a": {"b": 1, "c": [1, 2], "d": None}, "e": "x"}) == \
        {"a.b": 1, "a.c": "[1, 2]", "a.d": "None", "e": "x"}
    assert plan.flat_numbers({"x": 1, "y": {"z": 2.5, "s": "no"}, "b": False}, "summary") == \
        {"summary/x": 1.0, "summary/y/z": 2.5}


def test_tracking_config_is_strict_with_dotted_keys_and_choices():
    import pytest

    from gyre_hpc.config import load_config
    from gyre_hpc.errors import ConfigError

    assert load_config(LOCAL).tracking.backends == ("tensorboard",)
    with pytest.raises(ConfigError, match=r"tracking\.backends\[1\]: 'tb' is not one of 'tensorboard', 'wandb', "
                                          r"'mlflow'"):
        load_config(LOCAL, ["tracking.backends=[wandb, tb]"])
    with pytest.raises(ConfigError, match=r"tracking\.backends.*repeats"):
        load_config(LOCAL, ["tracking.backends=[wandb, wandb]"])
    with pytest.raises(ConfigError, match=r"unknown key tracking\.foo; valid keys of tracking: backends"):
        load_config(LOCAL, ["tracking.foo=1"])
    assert load_config(LOCAL, ["tracking.backends=[]"]).tracking.backends == ()


def test_images_every_steps_decides_which_steps_render_mid_run_plots():
    from gyre_hpc.config import TrackingConfig
    from gyre_hpc.tracking.live import images_due

    every3 = [s for s in range(1, 10) if images_due(TrackingConfig(images_every_steps=3), s, 10)]
    assert every3 == [3, 6, 9]
    assert not any(images_due(TrackingConfig(images_every_steps=0), s, 10) for s in range(1, 10))
    assert not images_due(TrackingConfig(images_every_steps=5), 10, 10)  # the last step: the run's own report
