"""The polling schedule, driven by a fake clock: changes are noticed within one poll
interval, the deadline is honoured exactly, and preemption stops the wait at once."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpulab.cloud.api import QueuedResourceInfo, QueuedResourceRequest
from tpulab.cloud.polling import wait_for_state
from tpulab.errors import (
    DeadlineError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    PreemptedError,
    QuotaError,
    TransientError,
)
from tpulab.models import NodeInfo, NodeRequest, NodeState
from tpulab.polling import Backoff, poll_until, retry_call, time_left
from tpulab.remote.keys import (
    HOST_KEY_ATTRIBUTE,
    GuestAttributesDisabledError,
    HostKey,
    HostKeyNotPublishedError,
    RunKey,
    wait_for_host_key,
)

_ED25519_BODY = RunKey().public_b64


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
    provider = "tpu-api"

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

    def guest_attributes(
        self, zone: str, node_id: str, query_path: str = "", *, worker: int = 0
    ) -> dict[str, str]:
        raise NotImplementedError

    # Queued resources are not part of a node wait.

    def create_queued_resource(self, zone: str, qr_id: str, request: QueuedResourceRequest) -> str:
        raise NotImplementedError

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResourceInfo:
        raise NotImplementedError

    def list_queued_resources(self, zone: str) -> list[QueuedResourceInfo]:
        raise NotImplementedError

    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool) -> str:
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


# -- retrying calls, nested deadlines (issue 9 item 5, issue 10 #2) ----------------------


class Flaky:
    """Fails with `error` the first `failures` times, then answers `value`."""

    def __init__(self, failures: int, error: Exception, value: str = "ok") -> None:
        self.failures = failures
        self.error = error
        self.value = value
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.value


def _unavailable() -> TransientError:
    return TransientError("Could not get node: unavailable.", status="UNAVAILABLE")


def _transient(error: Exception) -> bool:
    return isinstance(error, TransientError)


def test_retry_call_rides_out_a_storm_of_any_length_within_the_deadline() -> None:
    clock = FakeClock()
    call = Flaky(20, _unavailable())
    result = retry_call(
        call,
        retry_if=_transient,
        timeout=600,
        clock=clock,
        sleep=clock.sleep,
        backoff=Backoff(rng=random.Random(1)),
    )
    assert result == "ok"
    assert call.calls == 21  # not a fixed count of tries: twenty failures, then success
    assert len(clock.sleeps) == 20


def test_retry_call_raises_the_last_error_exactly_at_the_deadline() -> None:
    clock = FakeClock()
    start = clock.now
    seen: list[float] = []

    def call() -> str:
        seen.append(clock.now)
        raise _unavailable()

    heard: list[float] = []
    with pytest.raises(TransientError, match="unavailable"):
        retry_call(
            call,
            retry_if=_transient,
            timeout=45,
            clock=clock,
            sleep=clock.sleep,
            backoff=Backoff(rng=random.Random(2)),
            on_retry=lambda _error, delay: heard.append(delay),
        )
    assert seen[0] == start
    assert seen[-1] == pytest.approx(start + 45)  # one last try at the deadline
    assert clock.now == pytest.approx(start + 45)  # and never a sleep past it
    assert heard == clock.sleeps


def test_retry_call_passes_other_errors_through_at_once() -> None:
    clock = FakeClock()
    call = Flaky(5, QuotaError("quota", status="RESOURCE_EXHAUSTED"))
    with pytest.raises(QuotaError):
        retry_call(call, retry_if=_transient, timeout=600, clock=clock, sleep=clock.sleep)
    assert call.calls == 1
    assert clock.sleeps == []


def test_an_inner_retry_never_outlives_the_enclosing_deadline() -> None:
    # A GoogleTpuApi call (retry budget 1000 s here) inside the wait for READY (30 s):
    # the phase's deadline ends both, on whichever clock each runs.
    clock = FakeClock()
    start = clock.now
    inner_clock = FakeClock(now=5.0)  # another clock: deadlines must not mix their values

    def inner_sleep(seconds: float) -> None:
        inner_clock.sleep(seconds)
        clock.sleep(seconds)

    def probe() -> str:
        return retry_call(
            Flaky(10**6, _unavailable()),
            retry_if=_transient,
            timeout=1000,
            clock=inner_clock,
            sleep=inner_sleep,
        )

    with pytest.raises(DeadlineError, match="last error: Could not get node"):
        poll_until(
            probe,
            lambda state: state == "READY",
            timeout=30,
            clock=clock,
            sleep=clock.sleep,
            retry_if=_transient,
        )
    assert clock.now == pytest.approx(start + 30)


def test_time_left_is_the_timeout_outside_a_loop_and_the_rest_inside() -> None:
    assert time_left(12.5) == 12.5
    clock = FakeClock()
    left: list[float] = []

    def probe() -> bool:
        left.append(time_left(1000))
        return len(left) == 2

    poll_until(probe, bool, timeout=20, clock=clock, sleep=clock.sleep, backoff=[4.0])
    assert left == [20, 16]


def test_poll_until_counts_retryable_errors_as_not_yet() -> None:
    clock = FakeClock()
    states: Iterator[str | Exception] = iter([_unavailable(), "CREATING", _unavailable(), "READY"])

    def probe() -> str:
        state = next(states)
        if isinstance(state, Exception):
            raise state
        return state

    assert (
        poll_until(
            probe,
            lambda s: s == "READY",
            timeout=60,
            clock=clock,
            sleep=clock.sleep,
            retry_if=_transient,
        )
        == "READY"
    )


class StormyApi(ScriptedApi):
    """get_node answers 503 for the first `storm` calls."""

    def __init__(self, clock: FakeClock, script: list[tuple[float, NodeState]], storm: int):
        super().__init__(clock, script)
        self.storm = storm

    def get_node(self, zone: str, node_id: str) -> NodeInfo:
        if self.storm > 0:
            self.storm -= 1
            self.gets += 1
            raise _unavailable()
        return super().get_node(zone, node_id)


def test_wait_for_state_rides_out_a_storm_until_its_deadline() -> None:
    clock = FakeClock()
    api = StormyApi(clock, [(0, NodeState.READY)], storm=15)
    node = wait_for_state(
        api, "z", "n", {NodeState.READY}, timeout=900, clock=clock, sleep=clock.sleep
    )
    assert node.state is NodeState.READY
    assert api.gets == 16
    endless = StormyApi(clock, [(0, NodeState.READY)], storm=10**6)
    start = clock.now
    with pytest.raises(DeadlineError, match="unavailable"):
        wait_for_state(
            endless, "z", "n", {NodeState.READY}, timeout=120, clock=clock, sleep=clock.sleep
        )
    assert clock.now == pytest.approx(start + 120)


# -- the host-key wait (issue 11 #3) ------------------------------------------------------


@pytest.mark.parametrize(
    "not_yet",
    [
        NotFoundError("Could not read guest attributes: not found.", status="NOT_FOUND"),
        InvalidArgumentError("precondition", status="FAILED_PRECONDITION"),
        _unavailable(),
        # gcloud's `tpu-vm ssh` treats any HttpError here as "not yet" (issue 23 #6).
        InvalidArgumentError("bad request", status="INVALID_ARGUMENT"),
        PermissionDeniedError("denied", status="PERMISSION_DENIED"),
    ],
    ids=["404", "FAILED_PRECONDITION", "503", "INVALID_ARGUMENT", "PERMISSION_DENIED"],
)
def test_host_key_wait_treats_early_api_errors_as_not_published(not_yet: Exception) -> None:
    clock = FakeClock()
    fetch = Flaky(8, not_yet)
    key = HostKey("ssh-ed25519", _ED25519_BODY)

    def attrs() -> dict[str, str]:
        fetch()
        return {HOST_KEY_ATTRIBUTE: _ED25519_BODY}

    assert wait_for_host_key(attrs, timeout=60, clock=clock, sleep=clock.sleep) == key
    assert fetch.calls == 9


def test_host_key_wait_gives_up_at_its_deadline_quoting_the_last_error() -> None:
    clock = FakeClock()
    start = clock.now
    missing = Flaky(10**6, NotFoundError("not found", status="NOT_FOUND"))
    with pytest.raises(HostKeyNotPublishedError, match="within 30s"):
        wait_for_host_key(lambda: {"x": missing()}, timeout=30, clock=clock, sleep=clock.sleep)
    assert clock.now == pytest.approx(start + 30)
    # Any API error is "not yet" until the deadline, as gcloud has it; then it is quoted.
    denied = Flaky(
        10**6,
        PermissionDeniedError("Permission denied on guest attributes", status="PERMISSION_DENIED"),
    )
    with pytest.raises(HostKeyNotPublishedError) as caught:
        wait_for_host_key(lambda: {"x": denied()}, timeout=30, clock=clock, sleep=clock.sleep)
    assert denied.calls > 1
    assert (
        "the API's last answer: PERMISSION_DENIED: Permission denied on guest attributes"
        in caught.value.message
    )


def test_host_key_wait_names_the_guest_attributes_org_policy_at_once() -> None:
    clock = FakeClock()
    policy = Flaky(
        10**6,
        InvalidArgumentError(
            "Could not get guest attributes: the API rejected the request as invalid.",
            status="FAILED_PRECONDITION",
            api_message="Constraint constraints/compute.disableGuestAttributesAccess violated "
            "for projects/p: access to guest attributes is disabled by an organization policy.",
        ),
    )
    with pytest.raises(GuestAttributesDisabledError) as caught:
        wait_for_host_key(lambda: {"x": policy()}, timeout=30, clock=clock, sleep=clock.sleep)
    assert policy.calls == 1  # no wait can outlast a policy
    assert "compute.disableGuestAttributesAccess" in caught.value.message
    assert "org-policies disable-enforce compute.disableGuestAttributesAccess" in (
        caught.value.hint or ""
    )
