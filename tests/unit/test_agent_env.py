"""The synthetic agent environment (pure): determinism, branching rules, verifier, timing, timeouts, eval failures.

Runs are driven by ``workload.play`` in virtual time; the "model" is a seeded uniform token source (what a
randomly initialised model roughly is) or a rule-following one that reads the key from its input.
"""
import dataclasses

import numpy as np
import pytest

from gyre_hpc.agents import task as tk
from gyre_hpc.agents.env import Generate, Tool, rid_for, split_rid
from gyre_hpc.agents.task import Vocab, verify
from gyre_hpc.agents.workload import Workload, play, random_model
from gyre_hpc.config import AgentConfig, TrajectoryConfig
from gyre_hpc.errors import ConfigError
from gyre_hpc.trajectory.branches import classify
from gyre_hpc.trajectory.pipeline import build_batch
from gyre_hpc.trajectory.records import RunStatus, TitoLog, read_tito, write_tito
from gyre_hpc.trajectory.tree import build_tree

BRANCHY = AgentConfig(turns=(3, 6), tool_failure_prob=0.3, subagent_prob=0.3, context_budget=64)


def play_groups(cfg, groups, seed=0, model_seed=1, **kw):
    w = Workload(cfg, 256, seed)
    model = random_model(w.vocab, model_seed)
    runs = []
    for g in range(groups):
        for ep in w.group(g):
            calls, outcome = play(ep, model, **kw)
            runs.append((ep, calls, outcome))
    return runs


def as_log(runs):
    return TitoLog(tuple(c for _, calls, _ in runs for c in calls), tuple(o for _, _, o in runs))


def key_reader(action: Generate) -> list[int]:
    """Follows the rule: answers with content tokens of the last key class seen in its input (else class 0)."""
    keys = [t - tk.KEY_BASE for t in action.input_ids if tk.KEY_BASE <= t < tk.KEY_BASE + tk.N_KEYS]
    return [tk.CONTENT + (keys[-1] if keys else 0)] * action.max_new_tokens


# ------------------------------------------------------------------------------------------ determinism
def test_same_seed_same_log_other_seed_other_log(tmp_path):
    logs = [as_log(play_groups(BRANCHY, 3, seed=s)) for s in (5, 5, 6)]
    paths = [write_tito(tmp_path / f"{i}.jsonl", log.calls, log.outcomes) for i, log in enumerate(logs)]
    assert paths[0].read_bytes() == paths[1].read_bytes() != paths[2].read_bytes()


def test_control_flow_depends_on_output_lengths_not_content():
    w = Workload(BRANCHY, 256, 3)
    shapes = []
    for model in (random_model(w.vocab, 1), random_model(w.vocab, 2), key_reader):
        calls = [c for g in range(4) for ep in w.group(g) for c in play(ep, model)[0]]
        shapes.append([(c.run_id, c.call_id, len(c.input_ids), len(c.output_ids)) for c in calls])
    assert shapes[0] == shapes[1] == shapes[2]


def test_all_runs_of_a_group_get_the_same_task_and_distinct_run_ids():
    group = Workload(BRANCHY, 256, 0).group(7)
    assert len(group) == BRANCHY.runs_per_group
    assert len({ep.task for ep in group}) == 1 and group[0].task.query_id == "q7"
    assert [ep.run_id for ep in group] == [f"q7-r{j}" for j in range(BRANCHY.runs_per_group)]


# --------------------------------------------------------------------------------------------- branching
def test_every_branch_kind_appears_and_classify_recognises_each_call():
    runs = play_groups(BRANCHY, 12)
    meant = {}
    for ep, calls, outcome in runs:
        assert outcome.status is RunStatus.SCORED
        found = {b.call_id: b.kind.value for b in classify(build_tree(calls), calls)}
        assert found == ep.kinds, ep.run_id
        meant.update(found)
    assert set(meant.values()) == {"root", "continuation", "retry", "compression", "subagent"}


def test_branching_rules_follow_their_knobs():
    linear = play_groups(dataclasses.replace(BRANCHY, tool_failure_prob=0.0, subagent_prob=0.0,
                                             context_budget=1000), 4)
    assert {k for ep, _, _ in linear for k in ep.kinds.values()} == {"root", "continuation"}
    retries = play_groups(dataclasses.replace(BRANCHY, tool_failure_prob=1.0, max_retries=2, subagent_prob=0.0), 2)
    for ep, _, _ in retries:  # every tool fails: each model call is followed by exactly 2 retries
        kinds = list(ep.kinds.values())
        assert kinds.count("retry") == 2 * (len(kinds) - kinds.count("retry") - 1)


def test_inputs_fit_the_budget_and_the_vocabulary():
    for ep, calls, _ in play_groups(BRANCHY, 8):
        for c in calls:
            room = ep.cfg.answer_tokens if c.input_ids[-1] == tk.ANSWER else ep.cfg.call_tokens
            assert len(c.input_ids) + room <= BRANCHY.context_budget
            assert c.sequence.min() >= 0 and c.sequence.max() < 256


def test_contexts_open_with_the_system_prompt_and_a_distinct_header():
    w = Workload(BRANCHY, 256, 0)
    for ep, calls, _ in play_groups(BRANCHY, 6):
        S = len(w.system)
        openers = {tuple(c.input_ids[:S + 1]) for c in calls}
        assert all(o[:S] == w.system for o in openers)
        assert len({o[S] for o in openers}) == ep.n_contexts == len(openers)


def test_retry_repeats_the_input_and_continuation_extends_the_previous_call():
    for ep, calls, _ in play_groups(BRANCHY, 4):
        by_id = {c.call_id: c for c in calls}
        for prev, c in zip(calls, calls[1:]):
            kind = ep.kinds[c.call_id]
            if kind == "retry":
                assert np.array_equal(c.input_ids, prev.input_ids)
            if kind == "continuation":
                assert any(len(c.input_ids) > len(p.sequence) and np.array_equal(c.input_ids[:len(p.sequence)],
                                                                                  p.sequence)
                           for p in by_id.values() if p is not c)


def test_a_successful_tool_returns_filler_then_the_key_right_before_the_next_prompt():
    cfg = dataclasses.replace(BRANCHY, tool_failure_prob=0.0, subagent_prob=0.0, context_budget=1000,
                              tool_output_tokens=(2, 5))
    for ep, calls, _ in play_groups(cfg, 3):
        for prev, c in zip(calls, calls[1:]):
            added = c.input_ids[len(prev.sequence):].tolist()
            assert added[0] == tk.TOOL and added[-2:] == [Vocab.key(ep.task.key), c.input_ids[-1]]
            assert 2 <= len(added) - 3 <= 5 and all(t >= tk.CONTENT for t in added[1:-2])
    failing = dataclasses.replace(cfg, tool_failure_prob=1.0, max_retries=0)
    for ep, calls, _ in play_groups(failing, 2):
        for prev, c in zip(calls, calls[1:]):
            assert c.input_ids[len(prev.sequence):].tolist() == [tk.TOOL, tk.ERR, c.input_ids[-1]]  # no key


def test_compression_summarises_into_system_header_summary_task_and_key():
    cfg = dataclasses.replace(BRANCHY, tool_failure_prob=0.0, subagent_prob=0.0, context_budget=40, turns=(5, 5))
    ep, calls, _ = play_groups(cfg, 1)[0]
    w = Workload(cfg, 256, 0)
    comp = [c for c in calls if ep.kinds[c.call_id] == "compression"]
    assert comp
    for c in comp:
        S = len(w.system)
        assert tuple(c.input_ids[:S]) == w.system and c.input_ids[S + 1] == tk.SUMMARY
        assert list(c.input_ids[S + 2:]) == [*ep.task.tokens, Vocab.key(ep.task.key), c.input_ids[-1]]


def test_subagent_works_on_the_request_and_hands_its_result_back():
    cfg = dataclasses.replace(BRANCHY, subagent_prob=1.0, tool_failure_prob=0.0, context_budget=200, turns=(1, 1))
    ep, calls, outcome = play_groups(cfg, 1)[0]
    kinds = [ep.kinds[c.call_id] for c in calls]
    assert kinds[:2] == ["root", "subagent"] and outcome.status is RunStatus.SCORED
    parent, sub, answer = calls[0], calls[1], calls[-1]
    S = len(Workload(cfg, 256, 0).system)
    assert sub.input_ids[S + 1] == tk.SUB and list(sub.input_ids[S + 2:-1]) == parent.output_ids.tolist()
    back = answer.input_ids[len(parent.sequence):]
    assert back[0] == tk.RESULT and back[-2] == Vocab.key(ep.task.key) and back[-1] == tk.ANSWER


def test_played_runs_build_a_valid_training_batch(tmp_path):
    log = as_log(play_groups(BRANCHY, 4))
    back = read_tito(write_tito(tmp_path / "runs.jsonl", log.calls, log.outcomes), vocab_size=256)
    batch, report = build_batch(back, TrajectoryConfig(max_row_tokens=1024, j_max=None))
    batch.validate()
    assert report.tree_tokens < report.flat_tokens and report.trained_tokens == batch.trained_tokens
    assert set(report.branches) == {"root", "continuation", "retry", "compression", "subagent"}


# ---------------------------------------------------------------------------------------------- verifier
def test_verify_counts_right_content_tokens_over_the_room():
    c = tk.CONTENT
    assert verify([c + 1, c + 3, c + 2, c + 5], key=1, key_classes=2, n=4) == 0.75
    assert verify([c + 1, tk.KEY_BASE + 1, 7, c + 9], key=1, key_classes=2, n=4) == 0.5  # control ids are wrong
    assert verify([c + 1, c + 3, tk.END], key=1, key_classes=2, n=8) == 0.25  # stopping early: missing = wrong
    assert verify([c + 1] * 10, key=1, key_classes=2, n=8) == 1.0  # only the first n count
    assert verify([c + 4, c + 8], key=0, key_classes=4, n=2) == 1.0


def test_task_key_is_derived_from_the_task_tokens():
    w = Workload(dataclasses.replace(BRANCHY, key_classes=3), 256, 0)
    tasks = [w.task(i) for i in range(60)]
    assert all(t.key == sum(t.tokens) % 3 for t in tasks)
    assert {t.key for t in tasks} == {0, 1, 2}
    assert all(BRANCHY.turns[0] <= t.turns <= BRANCHY.turns[1] for t in tasks)


def test_a_rule_following_model_scores_one_and_a_uniform_one_scores_chance():
    cfg = dataclasses.replace(BRANCHY, key_classes=4)
    w = Workload(cfg, 256, 0)
    right = [play(ep, key_reader)[1].score for g in range(10) for ep in w.group(g)]
    assert right == [1.0] * len(right)
    chance = [o.score for _, _, o in play_groups(cfg, 50)]
    assert np.mean(chance) == pytest.approx((1 - tk.CONTENT / 256) / 4, abs=0.03)


def test_a_too_small_vocabulary_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.vocab_size: .* needs >= 96"):
        Workload(BRANCHY, 64, 0)


# ---------------------------------------------------------------------------------- timing and outcomes
def drive(ep, output=lambda action: [tk.CONTENT] * action.max_new_tokens):
    """Run an episode by hand; returns its actions."""
    actions, seen = ep.actions(), []
    action = next(actions)
    try:
        while True:
            seen.append(action)
            action = actions.send(output(action) if isinstance(action, Generate) else None)
    except StopIteration:
        return seen


def test_tool_times_are_long_tailed_lognormal_with_the_configured_median():
    cfg = AgentConfig(tool_time_median_s=0.2, tool_time_sigma=1.0, turns=(6, 6), subagent_prob=0.0)
    times = np.array([a.seconds for g in range(60) for ep in Workload(cfg, 256, 0).group(g) for a in drive(ep)
                      if isinstance(a, Tool)])
    assert len(times) > 1000
    assert np.median(times) == pytest.approx(0.2, rel=0.15)
    assert np.quantile(times, 0.99) / np.median(times) == pytest.approx(np.exp(2.326), rel=0.35)


def test_a_timed_out_run_with_a_draft_is_graded_on_its_last_draft():
    cfg = dataclasses.replace(BRANCHY, timeout_s=1.0, tool_time_median_s=0.3, tool_time_sigma=0.0, turns=(6, 6))
    for ep, calls, outcome in play_groups(cfg, 3, s_per_call=0.1):
        assert outcome.status is RunStatus.TIMEOUT_PARTIAL and outcome.t_end == 1.0
        assert ep.answer is None and calls and calls[-1].t_end <= 1.0
        draft, n = ep.drafts[-1]
        assert draft in {tuple(c.output_ids.tolist()) for c in calls}
        assert outcome.score == verify(draft, ep.task.key, cfg.key_classes, n)


def test_a_run_timed_out_before_any_draft_or_without_partial_scoring_is_unscorable():
    slow_model = dataclasses.replace(BRANCHY, timeout_s=0.5)
    for _, calls, outcome in play_groups(slow_model, 2, s_per_call=1.0):
        assert not calls and outcome.status is RunStatus.TIMEOUT_UNSCORABLE and outcome.score is None
    no_partial = dataclasses.replace(BRANCHY, timeout_s=1.0, partial_scoring=False)
    for _, calls, outcome in play_groups(no_partial, 2, s_per_call=0.3):
        assert calls and outcome.status is RunStatus.TIMEOUT_UNSCORABLE and outcome.score is None


@pytest.mark.parametrize("rate", [0.0, 0.2, 1.0])
def test_eval_failures_are_injected_at_their_rate_and_never_score_zero(rate):
    runs = play_groups(dataclasses.replace(BRANCHY, eval_failure_rate=rate, turns=(0, 0)), 250)
    failed = [o for _, _, o in runs if o.status is RunStatus.EVAL_FAILURE]
    assert all(o.score is None for o in failed)
    n = len(runs)
    assert abs(len(failed) - rate * n) <= 4 * np.sqrt(n * rate * (1 - rate)) + 1e-9


def test_aborted_outcome_has_no_score_and_keeps_the_detail():
    ep = Workload(BRANCHY, 256, 0).group(0)[0]
    o = ep.aborted_outcome(3.0, "engine gone")
    assert (o.status, o.score, o.detail, o.run_id) == (RunStatus.ABORTED, None, "engine gone", "q0-r0")


# ------------------------------------------------------------------------------------- engine interface
def test_rid_carries_run_and_call_ids():
    assert rid_for("q3-r1", "c7a1") == "q3-r1/c7a1"
    assert split_rid(rid_for("q3-r1", "c7a1")) == ("q3-r1", "c7a1")


def test_sampling_params_come_from_config_and_seed_per_call():
    cfg = dataclasses.replace(BRANCHY, temperature=0.7, top_p=0.9, top_k=20)
    w = Workload(cfg, 256, 0)
    p = w.sampling_params(6, "q0-r0", "c1")
    assert {k: p[k] for k in ("max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids")} == \
        {"max_new_tokens": 6, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "stop_token_ids": [tk.END]}
    assert p["sampling_seed"] == w.sampling_params(6, "q0-r0", "c1")["sampling_seed"]
    assert p["sampling_seed"] != w.sampling_params(6, "q0-r0", "c2")["sampling_seed"]
    assert p["sampling_seed"] != Workload(cfg, 256, 1).sampling_params(6, "q0-r0", "c1")["sampling_seed"]
    assert "sampling_seed" not in Workload(dataclasses.replace(cfg, seeded_sampling=False), 256, 0) \
        .sampling_params(6, "q0-r0", "c1")


def test_actions_are_generates_and_tools_only():
    ep = Workload(BRANCHY, 256, 0).group(0)[0]
    assert {type(a) for a in drive(ep)} == {Generate, Tool} and ep.answer is not None
