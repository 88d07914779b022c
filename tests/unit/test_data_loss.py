"""Lost groups of a live run: one event each, the share that stops the run, the summary (live.dataloss)."""
import pytest

from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.live.dataloss import LostGroups, over_share, summary


def group(gid, lost=None, statuses=("scored",) * 4):
    return {"gid": gid, "runs": len(statuses), "statuses": list(statuses), "lost": lost}


def test_the_share_is_of_the_larger_of_planned_and_completed_groups():
    assert not over_share(lost=8, completed=10, planned=160, max_share=0.05)  # 8 <= 0.05 x 160
    assert over_share(lost=9, completed=10, planned=160, max_share=0.05)
    assert over_share(lost=11, completed=200, planned=160, max_share=0.05)
    assert not over_share(lost=10, completed=200, planned=160, max_share=0.05)
    assert over_share(lost=1, completed=1, planned=160, max_share=0.0) and not over_share(0, 5, 160, 0.0)


def test_each_lost_group_is_logged_once_and_the_error_comes_once_when_the_share_is_exceeded():
    groups, events = [], []
    watch = LostGroups(lambda: groups, max_share=0.1, planned=10)
    groups += [group(0), group(1, "tito/q00001.jsonl: 1 integrity problem(s): run q1-r2: 0 outcome record(s)")]
    assert watch.poll(events.append) is None  # 1 of max(10, 2): not more than 10 %
    assert events == [{"event": "group_lost", "gid": 1, "runs": 4,
                       "reason": "tito/q00001.jsonl: 1 integrity problem(s): run q1-r2: 0 outcome record(s)"}]
    assert watch.poll(events.append) is None and len(events) == 1  # nothing new: nothing logged
    groups.append(group(2, "cannot be packed"))
    error = watch.poll(events.append)
    assert error.startswith("data loss: 2 of 3 groups lost (more than allocator.max_lost_group_share=0.1")
    assert [e["event"] for e in events] == ["group_lost", "group_lost", "error"] and events[-1]["error"] == error
    groups.append(group(3, "again"))
    assert watch.poll(events.append) == error and [e["event"] for e in events][-1] == "group_lost"


def test_groups_restored_from_an_earlier_segment_count_but_are_not_logged_again():
    groups, events = [group(0, "lost before the preemption")], []
    watch = LostGroups(lambda: groups, max_share=0.0, planned=8)
    groups.append(group(1))
    assert watch.poll(events.append) is not None  # 1 lost > 0
    assert [e["event"] for e in events] == ["error"]


def test_the_summary_counts_lost_groups_and_their_runs_that_would_have_trained():
    groups = [group(0), group(1, "why", ("scored", "aborted", "timeout_partial")), group(2)]
    assert summary(groups) == {"groups_lost": 1, "runs_lost_in_groups": 2,
                               "lost_groups": [{"gid": 1, "runs": 3, "reason": "why"}]}


def test_the_share_key_is_validated_with_its_dotted_name_and_explained():
    assert load_config(None).allocator.max_lost_group_share == 0.05
    with pytest.raises(ConfigError, match=r"allocator\.max_lost_group_share: must be in \[0, 1\], got 1.5"):
        load_config(None, ["allocator.max_lost_group_share=1.5"])
    from gyre_hpc.config import explain

    assert "allocator.max_lost_group_share" in [row[0] for row in explain()]
