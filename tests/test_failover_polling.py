"""The retry budget of --retry-until-up is a poll loop that must not shorten the loops
inside it: an attempt's teardown keeps its own deadline however little budget is left."""

from __future__ import annotations

from helpers import FakeClock

from tpulab.polling import poll_until, time_left


def _inner_budget(*, enclose: bool) -> float:
    clock = FakeClock()
    seen: list[float] = []

    def probe() -> bool:
        clock.now += 9.0  # most of the outer budget is gone when the inner loop starts
        seen.append(time_left(600.0))
        return True

    poll_until(probe, bool, timeout=10.0, clock=clock, sleep=clock.sleep, enclose=enclose)
    return seen[0]


def test_a_non_enclosing_loop_leaves_inner_deadlines_alone() -> None:
    assert _inner_budget(enclose=False) == 600.0


def test_an_enclosing_loop_still_cuts_inner_deadlines() -> None:
    assert _inner_budget(enclose=True) == 1.0
