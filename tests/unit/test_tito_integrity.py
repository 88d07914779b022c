"""A group's TITO file against what the proxy served and what the harness saw (trajectory.integrity)."""

from gyre_hpc.trajectory.integrity import Served, check_group
from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, TitoLog

#   q0-r0:  c0 [1 2] -> [3 4]      c1 [1 2 3 4 5] -> [6]
#   q0-r1:  c0 [1 2] -> [7]
CALLS = (Call.of("q0-r0", "c0", [1, 2], [3, 4]), Call.of("q0-r0", "c1", [1, 2, 3, 4, 5], [6]),
         Call.of("q0-r1", "c0", [1, 2], [7]))
OUTCOMES = (Outcome("q0-r0", "q0", RunStatus.SCORED, 0.5), Outcome("q0-r1", "q0", RunStatus.SCORED, 1.0))
SERVED = {"q0-r0": Served(2, 3), "q0-r1": Served(1, 1)}
SEEN = {"q0-r0": CALLS[:2], "q0-r1": CALLS[2:]}


def check(calls=CALLS, outcomes=OUTCOMES, served=SERVED, seen=SEEN, harness=OUTCOMES):
    return check_group(TitoLog(tuple(calls), tuple(outcomes)), harness, served, seen)


def test_a_complete_group_file_passes():
    assert check() == []


def test_a_run_without_or_with_two_outcome_records_is_reported():
    assert check(outcomes=OUTCOMES[:1]) == ["run q0-r1: 0 outcome record(s) in the file, expected 1"]
    assert check(outcomes=OUTCOMES + OUTCOMES[1:]) == ["run q0-r1: 2 outcome record(s) in the file, expected 1"]


def test_an_outcome_that_disagrees_with_the_harness_is_reported():
    other = (OUTCOMES[0], Outcome("q0-r1", "q0", RunStatus.SCORED, 0.0))
    assert check(outcomes=other) == ["run q0-r1: outcome scored/0.0 in the file, the harness decided scored/1.0"]


def test_fewer_call_records_than_the_proxy_served_is_reported_with_both_numbers():
    problems = check(calls=CALLS[1:], seen={})  # c0 of q0-r0 went elsewhere (or the file was cut)
    assert problems == ["run q0-r0: 1 call record(s) in the file, the proxy served 2",
                        "run q0-r0: 1 output token(s) in the file, the proxy served 3"]


def test_token_counts_that_disagree_with_the_proxy_or_the_harness_are_reported():
    cut = Call.of("q0-r0", "c0", [1, 2], [3])
    problems = check(calls=(cut,) + CALLS[1:])
    assert problems == ["run q0-r0: 2 output token(s) in the file, the proxy served 3",
                        "run q0-r0: call c0 has 1 output token(s) in the file, the harness got 2"]
    swapped = Call.of("q0-r0", "c0", [1, 2], [4, 3])
    assert check(calls=(swapped,) + CALLS[1:]) == [
        "run q0-r0: call c0 has 2 output token(s) in the file, the harness got 2 (different ids)"]


def test_a_call_the_harness_got_that_is_missing_from_the_file_is_reported():
    seen = {**SEEN, "q0-r1": SEEN["q0-r1"] + (Call.of("q0-r1", "c1", [1], [2]),)}
    assert check(seen=seen) == ["run q0-r1: call c1 answered to the harness is not in the file"]


def test_records_of_other_runs_and_a_missing_proxy_count_are_reported():
    stray = Call.of("q9-r0", "c0", [1], [2])
    assert check(calls=CALLS + (stray,)) == ["records of run(s) not in the group: q9-r0"]
    assert check(served={"q0-r0": SERVED["q0-r0"]}) == ["run q0-r1: the proxy reported no count of its calls"]


def test_extra_calls_the_proxy_served_but_the_harness_never_saw_are_fine():
    assert check(seen={"q0-r0": CALLS[:1]}) == []
