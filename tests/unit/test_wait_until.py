"""``clock.wait_until``: the one wait loop, on virtual time (no test here sleeps)."""
from gyre_hpc.clock import ManualClock, wait_until


def test_it_returns_the_first_truthy_value_without_sleeping_when_that_is_the_first_call():
    clock = ManualClock()
    assert wait_until(lambda: ["done"], 5.0, clock) == ["done"] and clock.slept == []


def test_it_polls_on_the_injected_clock_until_the_predicate_holds():
    clock = ManualClock()
    assert wait_until(lambda: clock.now() >= 0.3 and "ok", 10.0, clock, poll_s=0.1) == "ok"
    assert len(clock.slept) == 3 and abs(clock.now() - 0.3) < 1e-9


def test_on_timeout_it_returns_the_last_value_after_a_call_at_the_deadline_and_never_sleeps_past_it():
    clock, calls = ManualClock(), []
    got = wait_until(lambda: calls.append(clock.now()) or None, 1.0, clock, poll_s=0.3)
    assert got is None and abs(calls[-1] - 1.0) < 1e-9 and abs(clock.now() - 1.0) < 1e-9
    assert clock.slept[-1] < 0.3 + 1e-9 and abs(sum(clock.slept) - 1.0) < 1e-9


def test_the_poll_interval_doubles_up_to_its_cap_and_idle_runs_between_calls():
    clock, idles = ManualClock(), []
    wait_until(lambda: len(idles) >= 5, None, clock, poll_s=0.01, max_poll_s=0.04, idle=lambda: idles.append(1))
    assert clock.slept == [0.01, 0.02, 0.04, 0.04, 0.04]


def test_a_zero_timeout_still_asks_once():
    clock, calls = ManualClock(), []
    assert wait_until(lambda: calls.append(1) or 0, 0.0, clock) == 0 and calls == [1] and clock.slept == []
