"""GoogleTpuApi (the real google-cloud-tpu REST client) against the emulator over HTTP:
the node round trip, every error class from the wire, LRO success and failure,
pagination, retries and the request count."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import FakeClock

from tpulab import errors as E
from tpulab.cloud.classify import error_for_status
from tpulab.cloud.google import GoogleTpuApi
from tpulab.cloud.polling import wait_for_state
from tpulab.models import NodeRequest, NodeState

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"


def _api(emulator: Emulator, **kwargs: Any) -> GoogleTpuApi:
    from emulator_fixtures import api_for

    return api_for(emulator, **kwargs)


def _request(accelerator: str = "v5litepod-4", **kwargs: Any) -> NodeRequest:
    from emulator_fixtures import node_request

    return node_request(accelerator, **kwargs)


def _create_ready(api: GoogleTpuApi, name: str, **kwargs: Any) -> None:
    api.wait_operation(api.create_node(ZONE, name, _request(**kwargs)), timeout=10)


def test_create_wait_get_round_trips_the_node(
    held_emulator: tuple[Emulator, FakeClock],
) -> None:
    emulator, clock = held_emulator
    tpu_api = _api(emulator)
    keys = "tpulab:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample tpulab"
    operation = tpu_api.create_node(ZONE, "node-a", _request(spot=True, ssh_keys=keys))
    assert operation.startswith(f"projects/{PROJECT}/locations/{ZONE}/operations/")
    assert tpu_api.get_node(ZONE, "node-a").state is NodeState.CREATING
    clock.now += 1  # past create_seconds
    tpu_api.wait_operation(operation, timeout=10)
    node = tpu_api.get_node(ZONE, "node-a")
    assert node.state is NodeState.READY
    assert (node.project, node.zone, node.name) == (PROJECT, ZONE, "node-a")
    assert node.accelerator_type == "v5litepod-4"
    assert node.runtime_version == "v2-alpha-tpuv5-lite"
    assert node.labels == {"managed-by": "tpulab", "tpulab-run": "run-1"}
    assert node.managed_by_tpulab
    assert node.run_id == "run-1"
    assert node.metadata == {"ssh-keys": keys}
    assert node.spot is True
    assert node.ip_address
    assert node.external_ip
    assert node.create_time is not None
    assert node.health == "HEALTHY"
    # Every HTTP request was counted: the emulator saw exactly as many.
    assert tpu_api.call_count == sum(emulator.calls.values())


def test_delete_operation_completes_and_the_node_is_gone(
    held_emulator: tuple[Emulator, FakeClock],
) -> None:
    emulator, clock = held_emulator
    tpu_api = _api(emulator)
    create = tpu_api.create_node(ZONE, "node-b", _request())
    clock.now += 1
    tpu_api.wait_operation(create, timeout=10)
    operation = tpu_api.delete_node(ZONE, "node-b")
    assert tpu_api.get_node(ZONE, "node-b").state is NodeState.DELETING
    clock.now += 1  # past delete_seconds
    tpu_api.wait_operation(operation, timeout=10)
    with pytest.raises(E.NotFoundError):
        tpu_api.get_node(ZONE, "node-b")
    assert emulator.node_names() == []


def test_list_follows_every_page(emulator: Emulator) -> None:
    api = _api(emulator, list_page_size=2)
    for index in range(5):
        api.create_node(ZONE, f"node-{index}", _request(run_id=None if index == 4 else "r"))
    before = emulator.calls["list_nodes"]
    names = [node.name for node in api.list_nodes(ZONE)]
    assert names == [f"node-{i}" for i in range(5)]
    assert emulator.calls["list_nodes"] - before == 3  # 2 + 2 + 1
    assert [n.managed_by_tpulab for n in api.list_nodes(ZONE)] == [True] * 4 + [False]
    assert api.list_nodes("us-central1-b") == []


def test_list_follows_the_servers_own_page_size(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    from tpulab.emulator import Timing

    emulator = start_emulator(tmp_path / "small-pages", timing=Timing(page_size=2))
    api = _api(emulator)
    for index in range(3):
        api.create_node(ZONE, f"n{index}", _request())
    assert len(api.list_nodes(ZONE)) == 3
    assert emulator.calls["list_nodes"] == 2


def test_stockout_arrives_on_the_create_operation(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.stockout = True
    operation = tpu_api.create_node(ZONE, "node-s", _request())  # accepted synchronously
    with pytest.raises(E.StockoutError) as caught:
        tpu_api.wait_operation(operation, timeout=10)
    error = caught.value
    assert error.status == "RESOURCE_EXHAUSTED"
    assert "no more capacity" in error.api_message
    assert "node-s" in error.message
    assert ZONE in error.message
    assert error.hint
    assert "zone" in error.hint
    assert emulator.node_names() == []  # a stocked-out create leaves nothing behind


def test_stockout_in_one_zone_only(emulator: Emulator, tpu_api: GoogleTpuApi) -> None:
    emulator.faults.stockout_zones = ["us-west4-a"]  # another zone offering v5e
    with pytest.raises(E.StockoutError):
        tpu_api.wait_operation(tpu_api.create_node("us-west4-a", "n1", _request()), timeout=10)
    tpu_api.wait_operation(tpu_api.create_node(ZONE, "n1", _request()), timeout=10)


def test_quota_is_a_synchronous_429(emulator: Emulator, tpu_api: GoogleTpuApi) -> None:
    emulator.faults.quota = True
    with pytest.raises(E.QuotaError) as caught:
        tpu_api.create_node(ZONE, "node-q", _request())
    assert caught.value.status == "RESOURCE_EXHAUSTED"
    assert "Quota limit" in caught.value.api_message
    assert caught.value.hint
    assert "quota" in caught.value.hint.lower()
    assert emulator.node_names() == []


@pytest.mark.parametrize(
    ("zone", "accelerator", "runtime", "words"),
    [
        (ZONE, "v9-8", "v2-alpha-tpuv5-lite", "invalid AcceleratorType"),
        ("us-central1-c", "v5p-8", "v2-alpha-tpuv5", "invalid AcceleratorType"),
        (ZONE, "v5litepod-4", "no-such-runtime", "Invalid runtime version"),
    ],
)
def test_invalid_argument_is_a_synchronous_400(
    emulator: Emulator, tpu_api: GoogleTpuApi, zone: str, accelerator: str, runtime: str, words: str
) -> None:
    with pytest.raises(E.InvalidArgumentError) as caught:
        tpu_api.create_node(zone, "node-i", _request(accelerator, runtime=runtime))
    assert caught.value.status == "INVALID_ARGUMENT"
    assert words in caught.value.api_message
    assert emulator.node_names() == []


def test_invalid_type_fault_refuses_a_catalog_type(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.invalid_type = True
    # The real API's words (kept as api_message) mean "not offered here": a zone's refusal,
    # which failover reads as zone-scoped (cloud/classify.py).
    with pytest.raises(E.InvalidArgumentError, match="does not offer this accelerator") as caught:
        tpu_api.create_node(ZONE, "node-i", _request())
    assert "invalid AcceleratorType" in caught.value.api_message


def test_duplicate_name_is_409_already_exists(tpu_api: GoogleTpuApi) -> None:
    tpu_api.create_node(ZONE, "twin", _request())
    with pytest.raises(E.AlreadyExistsError) as caught:
        tpu_api.create_node(ZONE, "twin", _request())
    assert caught.value.status == "ALREADY_EXISTS"
    assert "already exists" in caught.value.api_message


def test_not_found_for_missing_nodes_and_location_error_for_unknown_zones(
    tpu_api: GoogleTpuApi,
) -> None:
    with pytest.raises(E.NotFoundError) as caught:
        tpu_api.get_node(ZONE, "ghost")
    assert "ghost" in caught.value.api_message
    with pytest.raises(E.NotFoundError):
        tpu_api.delete_node(ZONE, "ghost")
    # A zone the API does not know is a 403 "Location ... is not found or access is
    # unauthorized" on the real service (tests/test_classify.py), not a 404.
    with pytest.raises(E.LocationError, match="us-nowhere1-a"):
        tpu_api.list_nodes("us-nowhere1-a")


def test_permission_denied_is_403(emulator: Emulator) -> None:
    emulator.faults.deny_projects = ["locked-project"]
    api = _api(emulator, project="locked-project")
    with pytest.raises(E.PermissionDeniedError) as caught:
        api.list_nodes(ZONE)
    assert caught.value.status == "PERMISSION_DENIED"
    assert "locked-project" in caught.value.api_message
    assert caught.value.hint
    assert "enabled" in caught.value.hint


def test_transient_503s_are_retried_on_idempotent_calls(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    _create_ready(tpu_api, "node-t")
    emulator.faults.transient = {"get_node": 2}
    before = tpu_api.call_count
    assert tpu_api.get_node(ZONE, "node-t").state is NodeState.READY
    assert tpu_api.call_count - before == 3  # two 503s, then the answer
    emulator.faults.transient = {"*": 2}
    assert len(tpu_api.list_nodes(ZONE)) == 1


def test_rate_limit_429_is_transient_not_quota(emulator: Emulator, tpu_api: GoogleTpuApi) -> None:
    emulator.faults.rate_limited = {"list_nodes": 1}
    assert tpu_api.list_nodes(ZONE) == []
    emulator.faults.rate_limited = {"create_node": 1}
    with pytest.raises(E.TransientError) as caught:
        tpu_api.create_node(ZONE, "node-r", _request())
    assert "per minute" in caught.value.api_message.lower()


def test_create_is_sent_once_and_idempotent_calls_retry_until_their_deadline(
    emulator: Emulator,
) -> None:
    clock = FakeClock()
    api = _api(emulator, retry_for=5.0, clock=clock, sleep=clock.sleep)
    emulator.faults.transient = {"create_node": 1}
    with pytest.raises(E.TransientError) as caught:
        api.create_node(ZONE, "node-c", _request())
    assert caught.value.status == "UNAVAILABLE"
    assert api.call_count == 1  # whether a resend is safe is the lifecycle's call
    # A storm far longer than the old four tries is ridden out...
    emulator.faults.transient = {"get_node": 15}
    with pytest.raises(E.NotFoundError):
        api.get_node(ZONE, "node-c")
    assert api.call_count == 1 + 16
    # ...and only the deadline ends one that does not stop.
    emulator.faults.transient = {"get_node": 10**6}
    before, start = api.call_count, clock.now
    with pytest.raises(E.TransientError):
        api.get_node(ZONE, "node-c")
    assert clock.now == pytest.approx(start + 5.0)
    assert api.call_count - before > 16


def test_failed_delete_operation_leaves_the_node_for_a_retry(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    _create_ready(tpu_api, "node-d")
    emulator.faults.delete_failures = 1
    with pytest.raises(E.TransientError) as caught:
        tpu_api.wait_operation(tpu_api.delete_node(ZONE, "node-d"), timeout=10)
    assert caught.value.status == "INTERNAL"
    assert "delete node node-d" in caught.value.message
    assert tpu_api.get_node(ZONE, "node-d").state is NodeState.READY
    tpu_api.wait_operation(tpu_api.delete_node(ZONE, "node-d"), timeout=10)
    assert emulator.node_names() == []


def test_hanging_delete_hits_the_deadline(emulator: Emulator, tpu_api: GoogleTpuApi) -> None:
    _create_ready(tpu_api, "node-h")
    emulator.faults.delete_hangs = True
    operation = tpu_api.delete_node(ZONE, "node-h")
    with pytest.raises(E.DeadlineError, match="operation"):
        tpu_api.wait_operation(operation, timeout=0.3)
    assert tpu_api.get_node(ZONE, "node-h").state is NodeState.DELETING


def test_deleting_a_creating_node_aborts_its_create_operation(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    # A create that takes a minute: the delete lands while the node is CREATING however
    # loaded the machine is (the fast timing's 0.2 s let a loaded run's create finish
    # before its delete arrived, and nothing was aborted).
    from tpulab.emulator import Timing

    slow = dataclasses.replace(Timing.fast(), create_seconds=60.0)
    tpu_api = _api(start_emulator(tmp_path / "slow-create", timing=slow))
    create = tpu_api.create_node(ZONE, "node-x", _request())
    delete = tpu_api.delete_node(ZONE, "node-x")
    with pytest.raises(E.CloudError, match="deleted while it was being created") as aborted:
        tpu_api.wait_operation(create, timeout=10)
    assert not isinstance(aborted.value, E.DeadlineError)
    tpu_api.wait_operation(delete, timeout=10)
    assert tpu_api.list_nodes(ZONE) == []


def test_spot_preemption_is_seen_by_wait_for_state(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.preempt_after = 0.2
    _create_ready(tpu_api, "node-p", spot=True)
    _create_ready(tpu_api, "node-o")  # on-demand nodes are never preempted
    with pytest.raises(E.PreemptedError):
        wait_for_state(tpu_api, ZONE, "node-p", {NodeState.DELETING}, timeout=10)
    states = {n.name: n.state for n in tpu_api.list_nodes(ZONE)}
    assert states == {"node-p": NodeState.PREEMPTED, "node-o": NodeState.READY}
    tpu_api.wait_operation(tpu_api.delete_node(ZONE, "node-p"), timeout=10)
    assert emulator.node_names() == ["node-o"]


def test_guest_attributes_appear_late_when_told_to(
    held_emulator: tuple[Emulator, FakeClock],
) -> None:
    emulator, clock = held_emulator
    tpu_api = _api(emulator)
    emulator.faults.guest_attributes_delay = 0.5
    create = tpu_api.create_node(ZONE, "node-g", _request())
    clock.now += 0.3  # READY (create_seconds 0.2), not yet 0.5 s past it
    tpu_api.wait_operation(create, timeout=10)
    assert tpu_api.guest_attributes(ZONE, "node-g") == {}
    node = wait_for_state(tpu_api, ZONE, "node-g", {NodeState.READY}, timeout=5)
    assert node.state is NodeState.READY
    clock.now += 0.5
    attributes = tpu_api.guest_attributes(ZONE, "node-g")
    assert "tpulab-emulator/ready-time" in attributes
    assert tpu_api.guest_attributes(ZONE, "node-g", "hostkeys/") == {}


def test_an_endpoint_where_nothing_listens_is_unreachable_at_once(emulator: Emulator) -> None:
    api = _api(emulator)
    emulator.stop()
    with pytest.raises(E.UnreachableError, match="never sent") as caught:
        api.list_nodes(ZONE)
    assert "refused" in caught.value.message.lower()
    assert api.call_count == 1  # nothing listens: no point hammering it
    assert caught.value.hint
    assert "emulator" in caught.value.hint


class SilentServer:
    """A real TCP server that reads the request and then answers nothing (`hang`) or
    drops the connection: what a request lost after it was sent looks like."""

    def __init__(self, *, hang: bool) -> None:
        import socket
        import threading

        self.hang = hang
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)
            if self.hang:
                self.held.append(conn)
            else:
                conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("hang", [True, False], ids=["timeout", "dropped"])
def test_a_request_lost_after_sending_has_an_unknown_outcome(hang: bool) -> None:
    server = SilentServer(hang=hang)
    try:
        api = GoogleTpuApi(PROJECT, api_endpoint=server.url, request_timeout=0.3)
        with pytest.raises(E.OutcomeUnknownError, match="may have taken effect") as caught:
            api.create_node(ZONE, "node-u", _request())
        assert not isinstance(caught.value, E.UnreachableError)
        assert api.call_count == 1  # never resent: a second create could be the one
    finally:
        server.close()


def test_persistence_across_an_emulator_restart(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    state = tmp_path / "shared-state"
    first = start_emulator(state)
    api = _api(first)
    _create_ready(api, "survivor")
    creating = api.create_node(ZONE, "late-bloomer", _request())
    first.stop()  # the emulator dies with one node READY and one still CREATING

    second = start_emulator(state)
    api2 = _api(second)
    assert api2.get_node(ZONE, "survivor").state is NodeState.READY
    api2.wait_operation(creating, timeout=10)  # the old operation is still known
    assert {n.name: n.state for n in api2.list_nodes(ZONE)} == {
        "late-bloomer": NodeState.READY,
        "survivor": NodeState.READY,
    }
    api2.wait_operation(api2.delete_node(ZONE, "survivor"), timeout=10)
    second.stop()
    third = start_emulator(state)
    assert third.node_names() == ["late-bloomer"]


def test_error_for_status_maps_every_class() -> None:
    cases = {
        ("RESOURCE_EXHAUSTED", "There is no more capacity in the zone"): E.StockoutError,
        ("RESOURCE_EXHAUSTED", "Quota limit 'X' has been exceeded"): E.QuotaError,
        ("RESOURCE_EXHAUSTED", "Requests per minute exceeded"): E.TransientError,
        ("RESOURCE_EXHAUSTED", "Quota to generate TPUs exceeded"): E.QuotaError,
        ("INVALID_ARGUMENT", "bad"): E.InvalidArgumentError,
        ("ALREADY_EXISTS", "dup"): E.AlreadyExistsError,
        ("NOT_FOUND", "gone"): E.NotFoundError,
        ("PERMISSION_DENIED", "no"): E.PermissionDeniedError,
        ("UNAUTHENTICATED", "who"): E.PermissionDeniedError,
        ("UNAVAILABLE", "later"): E.TransientError,
        ("INTERNAL", "oops"): E.TransientError,
        ("DEADLINE_EXCEEDED", "slow"): E.DeadlineError,
    }
    for (status, message), kind in cases.items():
        error = error_for_status(status, message, "do it")
        assert type(error) is kind, (status, message)
        assert error.api_message == message
        assert error.hint
    assert type(error_for_status("DATA_LOSS", "x", "do it")) is E.CloudError


def test_a_malformed_endpoint_is_a_config_error_before_any_request() -> None:
    # The client is never built for a URL the endpoint rule refuses (no scheme here).
    with pytest.raises(E.ConfigError, match="Invalid API endpoint"):
        GoogleTpuApi("p-1", api_endpoint="localhost:8470")


def test_missing_project_is_a_config_error() -> None:
    with pytest.raises(E.ConfigError, match="project"):
        GoogleTpuApi("", api_endpoint="http://127.0.0.1:1")


@pytest.mark.parametrize("endpoint", [None, "https://tpu.googleapis.com"])
def test_google_path_without_credentials_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, endpoint: str | None
) -> None:
    # No ADC file, no key file, and no probing of the GCE metadata server.
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    with pytest.raises(E.ConfigError, match="credentials") as caught:
        GoogleTpuApi("some-project", api_endpoint=endpoint)
    assert caught.value.hint
    assert "application-default login" in caught.value.hint


def test_failed_delete_of_a_creating_spot_node_keeps_the_emulator_sane(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.preempt_after = 0.05
    emulator.faults.delete_failures = 1
    tpu_api.create_node(ZONE, "early", _request(spot=True))
    with pytest.raises(E.TransientError):
        tpu_api.wait_operation(tpu_api.delete_node(ZONE, "early"), timeout=10)
    node = wait_for_state(tpu_api, ZONE, "early", {NodeState.PREEMPTED}, timeout=10)
    assert node.state is NodeState.PREEMPTED
    tpu_api.wait_operation(tpu_api.delete_node(ZONE, "early"), timeout=10)
    assert emulator.node_names() == []
