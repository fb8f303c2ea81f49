"""Queued resources end whole (issue 23, item 5): how a queued resource that will never
bring a node ends the run.

- FAILED is classified through the one table (tpulab/cloud/classify.py) from
  `failedData.error`, code and message: a quota failure is a QuotaError, an invalid
  request is fatal (no other zone or pass would fare better), no capacity in time is a
  stockout. The emulator's FAILED carries a full google.rpc.Status.
- DELETING is final: a queued resource someone deleted ends the run at once.
- WAITING_FOR_RESOURCES is the first waiting state (Google: it replaced ACCEPTED).
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import TYPE_CHECKING, Any

from emulator_fixtures import api_for, node_request
from test_queued_run import PROJECT, ZONE, queued_resources, queued_spec

from tpulab.cloud.api import QueuedResourceRequest
from tpulab.cloud.classify import scope_of
from tpulab.errors import InvalidArgumentError, NotFoundError, QuotaError, StockoutError
from tpulab.run.progress import NullObserver

if TYPE_CHECKING:
    from helpers import FakeClock
    from run_rig import Rig

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def _raw_queued(emulator: Emulator, name: str) -> dict[str, Any]:
    url = f"{emulator.url}/v2/projects/{PROJECT}/locations/{ZONE}/queuedResources/{name}"
    with urllib.request.urlopen(url, timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def _queue(emulator: Emulator, name: str) -> None:
    api = api_for(emulator)
    request = QueuedResourceRequest(node_id=name, node=node_request())
    api.wait_operation(api.create_queued_resource(ZONE, name, request), timeout=10)


def _failed(emulator: Emulator, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        state = _raw_queued(emulator, name)["state"]
        if state["state"] == "FAILED":
            return state  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, state
        time.sleep(0.05)


def test_a_new_queued_resource_waits_for_resources_not_accepted(
    held_emulator: tuple[Emulator, FakeClock],
) -> None:
    emulator, _clock = held_emulator  # time stands still: the state it was created in
    emulator.faults.capacity_after = {ZONE: 3600.0}
    _queue(emulator, "qr-new")
    assert _raw_queued(emulator, "qr-new")["state"]["state"] == "WAITING_FOR_RESOURCES"
    assert api_for(emulator).get_queued_resource(ZONE, "qr-new").state == "WAITING_FOR_RESOURCES"


def test_failed_carries_a_full_rpc_status_for_quota_and_invalid_requests(
    emulator: Emulator,
) -> None:
    emulator.faults.quota_zones = [ZONE]
    _queue(emulator, "qr-quota")
    quota = _failed(emulator, "qr-quota")["failedData"]["error"]
    assert quota["code"] == 8  # RESOURCE_EXHAUSTED
    assert f"in zone {ZONE}" in quota["message"]
    assert [d["@type"] for d in quota["details"]] == [ERROR_INFO]

    emulator.faults.update({"quota_zones": [], "queued_invalid": True})
    _queue(emulator, "qr-invalid")
    invalid = _failed(emulator, "qr-invalid")["failedData"]["error"]
    assert invalid["code"] == 3  # INVALID_ARGUMENT
    assert invalid["message"] == "Request contains an invalid argument."
    assert invalid["details"][0]["@type"] == ERROR_INFO
    # The controller's client reads code and message.
    info = api_for(emulator).get_queued_resource(ZONE, "qr-invalid")
    assert (info.state, info.failure_code) == ("FAILED", 3)


def test_a_quota_failure_is_a_quota_error_not_a_stockout(embedded_rig: Rig) -> None:
    rig = embedded_rig
    rig.emulator.faults.quota_zones = [ZONE]
    life, _, error = rig.run(queued_spec(rig, "30s"))
    assert isinstance(error, QuotaError), error
    assert not isinstance(error, StockoutError)
    assert error.status == "RESOURCE_EXHAUSTED"
    assert scope_of(error) == "zone"  # the quota was said to be per zone
    assert "quota" in (error.hint or "").lower()
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []
    assert queued_resources(rig) == []


def test_an_invalid_request_failure_is_fatal(embedded_rig: Rig) -> None:
    rig = embedded_rig
    rig.emulator.faults.queued_invalid = True
    life, _, error = rig.run(queued_spec(rig, "30s"))
    assert isinstance(error, InvalidArgumentError), error
    assert error.status == "INVALID_ARGUMENT"
    assert scope_of(error) == "fatal"  # neither another zone nor --retry-until-up helps
    assert life.outcome.teardown_status == "confirmed"
    assert queued_resources(rig) == []


def test_no_capacity_before_the_window_closed_is_still_a_stockout(embedded_rig: Rig) -> None:
    rig = embedded_rig
    rig.emulator.faults.capacity_after = {ZONE: 3600.0}
    _, _, error = rig.run(queued_spec(rig, "2s"))
    assert isinstance(error, StockoutError), error
    assert "valid until" in error.message
    assert scope_of(error) == "zone"


class DeleteWhenWaiting(NullObserver):
    """Deletes the run's queued resource behind its back once it is waiting (as a
    colleague's `gcloud compute tpus queued-resources delete` would)."""

    def __init__(self, emulator: Emulator, name: str) -> None:
        self.emulator = emulator
        self.name = name
        self.sent = False

    def note(self, message: str) -> None:
        if self.sent or not message.endswith(": WAITING_FOR_RESOURCES"):
            return
        self.sent = True
        path = f"/v2/projects/{PROJECT}/locations/{ZONE}/queuedResources/{self.name}"
        request = urllib.request.Request(self.emulator.url + path, method="DELETE")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200


def test_a_deleted_queued_resource_ends_the_run_at_once(embedded_rig: Rig) -> None:
    rig = embedded_rig
    rig.emulator.faults.capacity_after = {ZONE: 3600.0}
    spec = queued_spec(rig, "1h")
    deleter = DeleteWhenWaiting(rig.emulator, spec.node_name)
    life, _, error = rig.run(spec, deleter)
    assert deleter.sent
    # Ended on seeing DELETING, not on the queued resource's absence or the timeout.
    assert isinstance(error, NotFoundError), error
    assert error.status == "DELETING"
    assert "being deleted" in error.message
    assert scope_of(error) == "fatal"
    assert life.outcome.teardown_status == "confirmed"
    assert queued_resources(rig) == []
