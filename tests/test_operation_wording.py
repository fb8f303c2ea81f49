"""What an operation that FAILED says (issue 10 #12): never "temporarily unavailable".

A create whose node is deleted while CREATING ends with ABORTED; a delete operation can
end with INTERNAL. Both are answers, not an outage: the error names what happened and
shows the API's own words (kept verbatim in `api_message` too). Driven through the real
client against the emulator's faults.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from delegating_api import DelegatingTpuApi
from helpers import FakeClock

from tpulab.emulator import Emulator, Timing
from tpulab.emulator.backends import make_host_backend
from tpulab.errors import CloudError, NotFoundError, TeardownError, TransientError
from tpulab.models import NodeRequest
from tpulab.run.teardown import delete_and_confirm

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter
    from run_rig import Rig

    from tpulab.cloud.google import GoogleTpuApi

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

ZONE = "us-central1-a"
EMULATOR_INTERNAL = "Internal error. Deleting the node failed; retry."


# Creates that stay CREATING long enough for someone to delete the node meanwhile.
SLOW_CREATE = Timing(create_seconds=60.0, delete_seconds=0.1, tick_seconds=0.02)


@pytest.fixture
def slow_rig(start_emulator: EmulatorStarter, tmp_path: Path) -> Iterator[Rig]:
    from emulator_fixtures import api_for
    from run_rig import Rig

    backend = make_host_backend("embedded", tmp_path / "ssh-hosts", image="preloaded")
    emulator = start_emulator(tmp_path / "emulator", host_backend=backend, timing=SLOW_CREATE)
    try:
        yield Rig(emulator, backend, api_for(emulator), tmp_path)
    finally:
        emulator.stop()
        backend.close()


def test_a_node_deleted_during_creation_says_so(slow_rig: Rig) -> None:
    from emulator_fixtures import node_request

    tpu_api = slow_rig.api
    operation = tpu_api.create_node(ZONE, "doomed", node_request())
    tpu_api.delete_node(ZONE, "doomed")
    with pytest.raises(CloudError) as caught:
        tpu_api.wait_operation(operation, timeout=10)
    error = caught.value
    assert isinstance(error, NotFoundError), type(error)
    assert not isinstance(error, TransientError)  # nothing to retry: the node is gone
    assert "temporarily unavailable" not in error.message
    assert "deleted while it was being created" in error.message
    assert "deleted during creation" in error.api_message
    assert error.status == "ABORTED"
    assert "tpulab list" in (error.hint or "")


def test_a_failed_delete_operation_shows_the_apis_internal_error(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    from emulator_fixtures import node_request

    tpu_api.wait_operation(tpu_api.create_node(ZONE, "sticky", node_request()), timeout=10)
    emulator.faults.delete_failures = 1000
    with pytest.raises(CloudError) as caught:
        tpu_api.wait_operation(tpu_api.delete_node(ZONE, "sticky"), timeout=10)
    error = caught.value
    assert error.status == "INTERNAL"
    assert error.api_message == EMULATOR_INTERNAL
    assert "temporarily unavailable" not in error.message
    assert EMULATOR_INTERNAL.rstrip(".") in error.message

    # The teardown that meets it for ever reports the API's words, not an outage. Its
    # deadline is on its own clock, which its sleeps between rounds move on: the rounds
    # it would make in 5 s, without waiting the 5 s.
    stepped = FakeClock()
    with pytest.raises(TeardownError) as failed:
        delete_and_confirm(
            tpu_api, ZONE, "sticky", run_id="run-1", timeout=5, poll=0.05,
            clock=stepped, sleep=stepped.sleep,
        )  # fmt: skip
    assert "temporarily unavailable" not in failed.value.message
    assert "INTERNAL" in failed.value.message
    assert EMULATOR_INTERNAL.rstrip(".") in failed.value.message
    assert "did not finish in 0 s" not in failed.value.message
    emulator.faults.delete_failures = 0
    report = delete_and_confirm(tpu_api, ZONE, "sticky", run_id="run-1", timeout=10, poll=0.05)
    assert report.confirmed
    assert emulator.node_names() == []


def test_a_run_whose_node_is_deleted_during_create_says_so(slow_rig: Rig) -> None:
    """The whole lifecycle: someone deletes the node while it is CREATING; the run fails
    with the wording above (exit 3 class), and its teardown confirms nothing is left."""
    from emulator_fixtures import api_for

    someone_else = api_for(slow_rig.emulator)

    class DeletedBySomeoneElse(DelegatingTpuApi):
        def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
            operation = self.api.create_node(zone, node_id, request)
            someone_else.delete_node(zone, node_id)
            return operation

    life, _, error = slow_rig.run(slow_rig.spec(), api=DeletedBySomeoneElse(slow_rig.api))
    assert isinstance(error, NotFoundError), error
    assert "deleted while it was being created" in error.message
    assert "temporarily unavailable" not in error.message
    assert life.outcome.teardown_status == "confirmed"
    assert slow_rig.leftovers() == []


def test_a_later_round_that_only_ran_out_of_time_does_not_hide_the_apis_error(
    held_emulator: tuple[Emulator, FakeClock],
) -> None:
    """The first delete operation ends INTERNAL; every later one is still running when its
    wait gets no time at all (as on a loaded machine near the deadline). The final
    message still quotes the API.

    The emulator's clock is held: the test moves it past the delete only in the first
    wait, so the first operation has provably ended and the later ones provably have not
    (on the real clock a loaded machine's later operation could end before its wait, and
    the last round then did not "only run out of time")."""
    from emulator_fixtures import api_for, node_request

    emulator, clock = held_emulator
    tpu_api = api_for(emulator)
    operation = tpu_api.create_node(ZONE, "late", node_request())
    clock.now += 60.0  # past Timing.fast()'s create
    tpu_api.wait_operation(operation, timeout=10)
    emulator.faults.delete_failures = 1000

    class NoTimeAfterTheFirst(DelegatingTpuApi):
        waits = 0

        def wait_operation(self, operation_name: str, *, timeout: float) -> None:
            self.waits += 1
            if self.waits == 1:
                clock.now += 60.0  # this operation ends (INTERNAL); later ones never do
                self.api.wait_operation(operation_name, timeout=max(timeout, 60.0))
            else:
                self.api.wait_operation(operation_name, timeout=0.0)

    api = NoTimeAfterTheFirst(tpu_api)
    stepped = FakeClock()  # the teardown's own deadline, as above
    with pytest.raises(TeardownError) as failed:
        delete_and_confirm(
            api, ZONE, "late", run_id="run-1", timeout=4, poll=0.05,
            clock=stepped, sleep=stepped.sleep,
        )  # fmt: skip
    assert api.waits > 1
    message = failed.value.message
    assert "did not finish" in message  # the last problem, as it happened
    assert "did not finish in 0 s" not in message
    assert f"INTERNAL: {EMULATOR_INTERNAL.rstrip('.')}" in message
    emulator.faults.delete_failures = 0
    clock.now += 60.0  # every operation in flight ends (the failing ones as INTERNAL)

    class ClockMovesOnWait(DelegatingTpuApi):
        def wait_operation(self, operation_name: str, *, timeout: float) -> None:
            clock.now += 60.0
            self.api.wait_operation(operation_name, timeout=timeout)

    assert delete_and_confirm(
        ClockMovesOnWait(tpu_api), ZONE, "late", run_id="run-1", timeout=10, poll=0.05
    ).confirmed
