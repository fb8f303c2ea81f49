"""The polling schedule, driven by a fake clock: changes are noticed within one poll
interval, the deadline is honoured exactly, and preemption stops the wait at once."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpulab.cloud.polling import Backoff, poll_until, wait_for_state
from tpulab.errors import DeadlineError, PreemptedError
from tpulab.models import NodeInfo, NodeRequest, NodeState


@dataclass
class FakeClock:
    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def test_backoff_starts_near_one_second_and_grows_to_the_cap() -> None:
    delays = []
    for delay in Backoff(rng=random.Random(7)):
        delays.append(delay)
        if len(delays) == 20:
            break
    assert 0.8 <= delays[0] <= 1.2
    assert all(0 < d <= 10.0 for d in delays)
    assert max(delays[-5:]) > 8.0  # jitter spreads it below the cap, never above
    # Growth: each un-jittered base is 1.6x the last until the cap.
    assert delays[4] > delays[0] * 2


def test_backoff_jitter_differs_between_controllers() -> None:
    first = list(itertools.islice(Backoff(rng=random.Random(1)), 5))
    second = list(itertools.islice(Backoff(rng=random.Random(2)), 5))
    assert first != second


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0}, {"initial": 2, "cap": 1}, {"factor": 0.5}, {"jitter": 1.0}],
)
def test_backoff_rejects_nonsense(kwargs: dict[str, float]) -> None:
    settings = {"initial": 1.0, "cap": 10.0, "factor": 1.6, "jitter": 0.2, **kwargs}
    with pytest.raises(ValueError, match="bad backoff"):
        Backoff(settings["initial"], settings["cap"], settings["factor"], settings["jitter"])


@settings(max_examples=200, deadline=None)
@given(
    ready_after=st.floats(min_value=0.0, max_value=500.0),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_ready_is_noticed_within_one_poll_interval(ready_after: float, seed: int) -> None:
    clock = FakeClock()
    ready_at = clock.now + ready_after
    probes: list[float] = []

    def probe() -> str:
        probes.append(clock.now)
        return "READY" if clock.now >= ready_at else "CREATING"

    result = poll_until(
        probe,
        lambda state: state == "READY",
        timeout=3600,
        clock=clock,
        sleep=clock.sleep,
        backoff=Backoff(rng=random.Random(seed)),
    )
    assert result == "READY"
    noticed = clock.now
    assert noticed >= ready_at
    if len(probes) > 1:
        # The probe before the last one still saw CREATING, so READY arrived inside the
        # last interval: lateness is at most that one interval, itself at most the cap.
        assert probes[-2] < ready_at
        assert noticed - ready_at <= clock.sleeps[-1] <= 10.0
    else:
        assert ready_at <= probes[0]  # already READY at the first probe


def test_deadline_is_honoured_exactly_with_a_last_probe_at_it() -> None:
    clock = FakeClock()
    start = clock.now
    probes: list[float] = []

    def probe() -> str:
        probes.append(clock.now)
        return "CREATING"

    with pytest.raises(DeadlineError, match=r"after 30s waiting for node x \(last CREATING\)"):
        poll_until(
            probe,
            lambda state: state == "READY",
            timeout=30,
            clock=clock,
            sleep=clock.sleep,
            backoff=Backoff(rng=random.Random(3)),
            describe=lambda last: f"node x (last {last})",
        )
    assert clock.now == pytest.approx(start + 30)  # never slept past the deadline
    assert probes[0] == start
    assert probes[-1] == pytest.approx(start + 30)
    assert all(d <= 10.0 for d in clock.sleeps)


def test_zero_timeout_probes_once() -> None:
    clock = FakeClock()
    calls = []
    with pytest.raises(DeadlineError):
        poll_until(
            lambda: calls.append(1),
            lambda _: False,
            timeout=0,
            clock=clock,
            sleep=clock.sleep,
        )
    assert calls == [1]
    assert clock.sleeps == []


class ScriptedApi:
    """A TpuApi whose node moves through `script` [(from_time, state), ...] on a fake
    clock: the seam the lifecycle injects, driven here without any network."""

    project = "p"

    def __init__(self, clock: FakeClock, script: list[tuple[float, NodeState]]) -> None:
        self.clock = clock
        self.script = script
        self.gets = 0

    @property
    def call_count(self) -> int:
        return self.gets

    def get_node(self, zone: str, node_id: str) -> NodeInfo:
        self.gets += 1
        state = NodeState.STATE_UNSPECIFIED
        for since, scripted in self.script:
            if self.clock.now >= since:
                state = scripted
        return NodeInfo(project=self.project, zone=zone, name=node_id, state=state)

    def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
        raise NotImplementedError

    def wait_operation(self, operation_name: str, *, timeout: float) -> None:
        raise NotImplementedError

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        raise NotImplementedError

    def delete_node(self, zone: str, node_id: str) -> str:
        raise NotImplementedError

    def guest_attributes(self, zone: str, node_id: str, query_path: str = "") -> dict[str, str]:
        raise NotImplementedError


def test_wait_for_state_returns_the_ready_node_within_one_interval() -> None:
    clock = FakeClock()
    ready_at = clock.now + 47.3
    api = ScriptedApi(clock, [(0, NodeState.CREATING), (ready_at, NodeState.READY)])
    node = wait_for_state(
        api,
        "us-central1-a",
        "n",
        {NodeState.READY},
        timeout=900,
        poll=Backoff(rng=random.Random(5)),
        clock=clock,
        sleep=clock.sleep,
    )
    assert node.state is NodeState.READY
    assert node.name == "n"
    assert 0 <= clock.now - ready_at <= clock.sleeps[-1] <= 10.0
    assert api.gets == len(clock.sleeps) + 1


def test_wait_for_state_stops_at_preemption() -> None:
    clock = FakeClock()
    api = ScriptedApi(clock, [(0, NodeState.CREATING), (clock.now + 12, NodeState.PREEMPTED)])
    with pytest.raises(PreemptedError, match="preempted") as caught:
        wait_for_state(
            api, "z", "n", {NodeState.READY}, timeout=900, clock=clock, sleep=clock.sleep
        )
    assert caught.value.hint
    assert "spot" in caught.value.hint.lower()
    assert clock.now < 1000 + 12 + 10.0  # stopped at the first probe that saw it


def test_wait_for_state_deadline_names_the_last_state() -> None:
    clock = FakeClock()
    api = ScriptedApi(clock, [(0, NodeState.CREATING)])
    with pytest.raises(DeadlineError, match=r"READY.*last state CREATING"):
        wait_for_state(api, "z", "n", {NodeState.READY}, timeout=60, clock=clock, sleep=clock.sleep)
    assert clock.now == pytest.approx(1060)
