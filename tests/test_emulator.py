"""The emulator on the wire, as raw HTTP: Google's JSON shapes, int/string enums, error
bodies, the admin endpoints, and the state file it keeps on disk."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import FakeClock, wait_until

from tpulab.emulator import FaultPlan, Timing
from tpulab.emulator.wire import ACCELERATOR_CONFIG_TYPES, API_VERSIONS, HEALTHS, STATES

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

BASE = "/v2/projects/p/locations/us-central1-a"


def call(
    emulator: Emulator, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        emulator.url + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def create(emulator: Emulator, name: str, **node: Any) -> dict[str, Any]:
    body = {"acceleratorType": "v5litepod-4", "runtimeVersion": "v2-alpha-tpuv5-lite", **node}
    status, operation = call(emulator, "POST", f"{BASE}/nodes?nodeId={name}", body)
    assert status == 200, operation
    return operation


def wait_done(emulator: Emulator, operation: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        status, current = call(emulator, "GET", "/v2/" + operation["name"])
        assert status == 200
        if current["done"]:
            return current
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_enum_numbers_match_the_client_library() -> None:
    from google.cloud.tpu_v2.types import cloud_tpu

    pairs: list[tuple[dict[str, int], Any]] = [
        (STATES, cloud_tpu.Node.State),
        (HEALTHS, cloud_tpu.Node.Health),
        (API_VERSIONS, cloud_tpu.Node.ApiVersion),
        (ACCELERATOR_CONFIG_TYPES, cloud_tpu.AcceleratorConfig.Type),
    ]
    for ours, theirs in pairs:
        assert ours == {member.name: member.value for member in theirs}


def test_enums_are_names_unless_ints_are_asked_for(emulator: Emulator) -> None:
    wait_done(emulator, create(emulator, "n1"))
    _, as_names = call(emulator, "GET", f"{BASE}/nodes/n1")
    _, as_ints = call(emulator, "GET", f"{BASE}/nodes/n1?$alt=json;enum-encoding=int")
    assert (as_names["state"], as_names["apiVersion"], as_names["health"]) == (
        "READY",
        "V2",
        "HEALTHY",
    )
    assert (as_ints["state"], as_ints["apiVersion"], as_ints["health"]) == (2, 4, 1)
    assert as_names["acceleratorConfig"] == {"type": "V5LITE_POD", "topology": "2x2"}


def test_operation_shape_and_node_json(emulator: Emulator) -> None:
    operation = create(
        emulator,
        "n2",
        labels={"managed-by": "tpulab"},
        metadata={"ssh-keys": "u:ssh-ed25519 AAAA u"},
        schedulingConfig={"spot": True},
        networkConfig={"enableExternalIps": True},
    )
    assert operation["done"] is False
    assert operation["metadata"]["@type"].endswith("google.cloud.tpu.v2.OperationMetadata")
    assert operation["metadata"]["verb"] == "create"
    assert operation["metadata"]["target"] == "projects/p/locations/us-central1-a/nodes/n2"
    done = wait_done(emulator, operation)
    assert "error" not in done
    assert "endTime" in done["metadata"]
    node = done["response"]
    assert node["@type"] == "type.googleapis.com/google.cloud.tpu.v2.Node"
    assert node["name"] == "projects/p/locations/us-central1-a/nodes/n2"
    assert node["state"] == "READY"
    assert node["labels"] == {"managed-by": "tpulab"}
    assert node["metadata"] == {"ssh-keys": "u:ssh-ed25519 AAAA u"}
    assert node["schedulingConfig"] == {"preemptible": False, "spot": True}
    assert node["createTime"].endswith("Z")
    assert isinstance(node["id"], str)
    endpoint = node["networkEndpoints"][0]
    assert endpoint["ipAddress"]
    assert endpoint["accessConfig"]["externalIp"]
    deleted = wait_done(emulator, call(emulator, "DELETE", f"{BASE}/nodes/n2")[1])
    assert deleted["response"] == {"@type": "type.googleapis.com/google.protobuf.Empty"}
    _, operations = call(emulator, "GET", f"{BASE}/operations")
    assert [op["metadata"]["verb"] for op in operations["operations"]] == ["create", "delete"]


def test_accelerator_config_and_int_enums_are_accepted_on_input(emulator: Emulator) -> None:
    body = {
        "acceleratorConfig": {"type": 11, "topology": "2x2"},  # V6E as a number
        "runtimeVersion": "v2-alpha-tpuv6e",
    }
    v6e_zone = "/v2/projects/p/locations/us-central1-b"  # us-central1-a hosts no v6e
    status, _ = call(emulator, "POST", f"{v6e_zone}/nodes?nodeId=n3", body)
    assert status == 200
    _, node = call(emulator, "GET", f"{v6e_zone}/nodes/n3")
    assert node["acceleratorType"] == "v6e-4"


@pytest.mark.parametrize(
    ("method", "path", "body", "code", "status", "words"),
    [
        ("GET", f"{BASE}/nodes/ghost", None, 404, "NOT_FOUND", "ghost"),
        # The real API answers an unknown zone with 403, "Location Z is not found or access
        # is unauthorized." (tests/test_classify.py), not 404.
        (
            "GET",
            "/v2/projects/p/locations/xx-none9-z/nodes",
            None,
            403,
            "PERMISSION_DENIED",
            "xx-none9",
        ),
        ("POST", f"{BASE}/nodes", {}, 400, "INVALID_ARGUMENT", "nodeId"),
        ("POST", f"{BASE}/nodes?nodeId=Bad_Name", {}, 400, "INVALID_ARGUMENT", "Bad_Name"),
        ("GET", f"{BASE}/nodes?pageToken=zz", None, 400, "INVALID_ARGUMENT", "pageToken"),
        ("GET", "/v3/nothing", None, 404, "NOT_FOUND", "No such method"),
    ],
)
def test_errors_use_googles_shape(
    emulator: Emulator,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    code: int,
    status: str,
    words: str,
) -> None:
    got_code, answer = call(emulator, method, path, body)
    assert got_code == code
    error = answer["error"]
    assert error["code"] == code
    assert error["status"] == status
    assert words in error["message"]
    assert error["details"][0]["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"


def test_malformed_json_is_a_400(emulator: Emulator) -> None:
    request = urllib.request.Request(
        emulator.url + f"{BASE}/nodes?nodeId=n", data=b"{not json", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400
    assert "Invalid JSON" in json.loads(caught.value.read())["error"]["message"]


def test_locations_accelerator_types_and_runtime_versions(emulator: Emulator) -> None:
    _, locations = call(emulator, "GET", "/v2/projects/p/locations")
    ids = [loc["locationId"] for loc in locations["locations"]]
    assert "us-central1-a" in ids
    assert "europe-west4-a" in ids
    _, types = call(emulator, "GET", "/v2/projects/p/locations/us-central1-c/acceleratorTypes")
    names = {t["type"] for t in types["acceleratorTypes"]}
    assert "v2-8" in names
    assert "v5litepod-4" not in names
    _, versions = call(emulator, "GET", f"{BASE}/runtimeVersions")
    assert "v2-alpha-tpuv5-lite" in {v["version"] for v in versions["runtimeVersions"]}
    assert call(emulator, "GET", f"{BASE}/runtimeVersions/nope")[0] == 404


def test_admin_endpoint_injects_faults_and_shows_state(emulator: Emulator) -> None:
    status, faults = call(emulator, "POST", "/_emulator/faults", {"stockout": True})
    assert status == 200
    assert faults["stockout"] is True
    assert emulator.faults.stockout is True
    done = wait_done(emulator, create(emulator, "n4"))
    assert done["error"]["code"] == 8
    assert "no more capacity" in done["error"]["message"]
    status, answer = call(emulator, "POST", "/_emulator/faults", {"stockot": True})
    assert status == 400
    assert "stockot" in answer["error"]["message"]
    status, answer = call(emulator, "POST", "/_emulator/faults", {"transient": {"nope": 1}})
    assert status == 400
    assert "nope" in answer["error"]["message"]
    _, state = call(emulator, "GET", "/_emulator/state")
    assert state["nodes"] == {}
    assert state["calls"]["create_node"] == 1


def test_transient_fault_counts_down(emulator: Emulator) -> None:
    emulator.faults.transient = {"list_nodes": 2}
    codes = [call(emulator, "GET", f"{BASE}/nodes")[0] for _ in range(3)]
    assert codes == [503, 503, 200]
    assert emulator.faults.transient == {"list_nodes": 0}


def test_fault_plan_validates_updates() -> None:
    plan = FaultPlan()
    plan.update({"delete_failures": 2, "preempt_after": 1, "stockout_zones": ["z"]})
    assert (plan.delete_failures, plan.preempt_after, plan.stockout_zones) == (2, 1.0, ["z"])
    for bad in ({"delete_failures": -1}, {"quota": "yes"}, {"transient": {"*": True}}):
        with pytest.raises(ValueError, match="cannot be"):
            plan.update(bad)
    plan.reset()
    assert plan.to_dict() == FaultPlan().to_dict()


def test_state_survives_on_disk_and_faults_json_seeds_faults(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = start_emulator(state)
    create(first, "kept")
    first.stop()
    saved = json.loads((state / "state.json").read_text())
    assert list(saved["nodes"]) == ["p/us-central1-a/kept"]
    assert not list(state.glob(".state-*"))  # atomic writes leave no temporary files
    (state / "faults.json").write_text(json.dumps({"quota": True}))
    second = start_emulator(state)
    assert second.faults.quota is True
    status, answer = call(
        second,
        "POST",
        f"{BASE}/nodes?nodeId=more",
        {"acceleratorType": "v5litepod-4", "runtimeVersion": "v2-alpha-tpuv5-lite"},
    )
    assert status == 429
    assert answer["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert second.node_names() == ["kept"]


def test_two_emulators_on_one_state_agree(start_emulator: EmulatorStarter, tmp_path: Path) -> None:
    state = tmp_path / "shared"
    served = start_emulator(state)
    embedded = start_emulator(state)  # e.g. `tpulab list --emulate` while a server runs
    create(served, "seen-by-both")
    assert embedded.node_names() == ["seen-by-both"]
    call(embedded, "DELETE", f"{BASE}/nodes/seen-by-both")
    deadline = time.monotonic() + 5
    while served.node_names():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_the_ticker_sleeps_until_a_transition_is_due_and_applies_it_then(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    """No request after the create: only the ticker can make the node READY. It is woken
    by the create's write and then sleeps until `ready_at`, not polling every tick (it
    would tick ~40 times in the 0.8 s) nor sleeping out its idle 30 s."""
    timing = Timing(create_seconds=0.8, tick_seconds=0.02, idle_tick_seconds=30.0)
    emulator = start_emulator(tmp_path / "state", timing=timing)
    state_file = tmp_path / "state" / "state.json"

    def on_disk() -> dict[str, Any]:  # read without a transaction: it would advance
        nodes = json.loads(state_file.read_text())["nodes"]
        return next(iter(nodes.values()), {})

    # The start's own tick wrote the fresh state, which wakes the ticker once more: the
    # count starts after that tick (on a loaded machine it came after the create's).
    wait_until(lambda: emulator.ticks >= 2, "the ticker's tick for the start's write", 10)
    ticks = emulator.ticks
    create(emulator, "n1")
    wait_until(lambda: on_disk().get("state") == "READY", "the ticker made the node READY", 10)
    late = time.time() - on_disk()["ready_at"]
    assert late < 5.0, late
    # Woken by the create's write, once at ready_at, once by its own write then.
    assert emulator.ticks - ticks <= 4, emulator.ticks - ticks


def test_clearing_delete_hangs_lets_the_hung_delete_finish(
    held_emulator: tuple[Emulator, FakeClock],
) -> None:
    emulator, clock = held_emulator
    created = create(emulator, "hung")
    clock.now += 1  # past create_seconds
    wait_done(emulator, created)
    emulator.faults.delete_hangs = True
    status, operation = call(emulator, "DELETE", f"{BASE}/nodes/hung")
    assert status == 200
    # The emulator's clock, not a sleep: a minute of delete_seconds (0.1 s) has passed
    # when the GET's transaction advances the node, however late this machine runs it.
    clock.now += 60
    _, node = call(emulator, "GET", f"{BASE}/nodes/hung")
    assert node["state"] == "DELETING"
    assert call(emulator, "GET", "/v2/" + operation["name"])[1]["done"] is False
    emulator.faults.delete_hangs = False
    # The next look at the node starts the delete's normal course, delete_seconds long.
    assert call(emulator, "GET", f"{BASE}/nodes/hung")[1]["state"] == "DELETING"
    clock.now += 1
    done = wait_done(emulator, operation)
    assert "error" not in done
    assert call(emulator, "GET", f"{BASE}/nodes/hung")[0] == 404


def _strict_json(raw: bytes) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def test_faults_endpoint_speaks_only_valid_json(emulator: Emulator) -> None:
    for body in (b'{"ssh_refuse_for": 1e999}', b'{"guest_attributes_delay": Infinity}'):
        request = urllib.request.Request(
            emulator.url + "/_emulator/faults", data=body, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 400
        assert "error" in _strict_json(caught.value.read())
    with urllib.request.urlopen(emulator.url + "/_emulator/faults", timeout=10) as response:
        faults = _strict_json(response.read())
    assert faults["ssh_refuse_for"] == 0.0
    assert faults["guest_attributes_delay"] == 0.0


def test_update_node_applies_only_the_mask_when_its_operation_ends(
    held_emulator: tuple[Emulator, FakeClock],
) -> None:
    emulator, clock = held_emulator
    created = create(emulator, "u1", labels={"a": "1"}, description="before")
    clock.now += 1
    wait_done(emulator, created)
    body = {"labels": {"a": "2", "b": "3"}, "description": "not in the mask", "tags": ["t"]}
    status, operation = call(emulator, "PATCH", f"{BASE}/nodes/u1?updateMask=labels,tags", body)
    assert status == 200, operation
    assert operation["done"] is False
    assert operation["metadata"]["verb"] == "update"
    # A second update while the first is in flight is refused (gcloud expects a 409).
    status, answer = call(emulator, "PATCH", f"{BASE}/nodes/u1?updateMask=labels", body)
    assert (status, answer["error"]["status"]) == (409, "ABORTED")
    clock.now += 1  # past update_seconds
    done = wait_done(emulator, operation)
    assert "error" not in done
    node = done["response"]
    assert node["@type"] == "type.googleapis.com/google.cloud.tpu.v2.Node"
    assert node["labels"] == {"a": "2", "b": "3"}
    assert node["tags"] == ["t"]
    assert node["description"] == "before"
    assert call(emulator, "GET", f"{BASE}/nodes/u1")[1]["labels"] == {"a": "2", "b": "3"}


@pytest.mark.parametrize(
    ("query", "code", "status", "words"),
    [
        ("", 400, "INVALID_ARGUMENT", "updateMask is required"),
        ("?updateMask=acceleratorType", 400, "INVALID_ARGUMENT", "acceleratorType"),
        ("?updateMask=data_disks", 400, "INVALID_ARGUMENT", "data_disks"),
    ],
)
def test_update_node_refuses_what_it_cannot_update(
    emulator: Emulator, query: str, code: int, status: str, words: str
) -> None:
    wait_done(emulator, create(emulator, "u2"))
    got, answer = call(emulator, "PATCH", f"{BASE}/nodes/u2{query}", {"labels": {}})
    assert (got, answer["error"]["status"]) == (code, status)
    assert words in answer["error"]["message"]


def test_update_node_refuses_labels_google_refuses(emulator: Emulator) -> None:
    wait_done(emulator, create(emulator, "u3", labels={"a": "b"}))
    got, answer = call(
        emulator, "PATCH", f"{BASE}/nodes/u3?updateMask=labels", {"labels": {"a": "B"}}
    )
    assert (got, answer["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert answer["error"]["message"] == (
        "resource labels are invalid: value \"B\" contains invalid character 'B' at index 0 "
        'for key "a"'
    )
    assert call(emulator, "GET", f"{BASE}/nodes/u3")[1]["labels"] == {"a": "b"}


def test_update_node_needs_a_ready_node(held_emulator: tuple[Emulator, FakeClock]) -> None:
    emulator, _ = held_emulator
    create(emulator, "u3")  # still CREATING: its clock stands still
    got, answer = call(emulator, "PATCH", f"{BASE}/nodes/u3?updateMask=labels", {"labels": {}})
    assert (got, answer["error"]["status"]) == (400, "FAILED_PRECONDITION")
    assert call(emulator, "PATCH", f"{BASE}/nodes/nope?updateMask=labels", {})[0] == 404


@pytest.mark.parametrize(
    ("zone", "offered", "refused"),
    [
        # cloud.google.com/tpu/docs/regions-zones, North America
        ("us-central1-a", {"v5litepod-4", "v5p-8", "v3-8", "v2-32"}, {"v6e-4", "v4-8", "v2-8"}),
        ("us-central1-b", {"v6e-4", "v2-8", "v3-8"}, {"v5litepod-4", "v5p-8", "v2-32"}),
        ("us-east5-b", {"v6e-8"}, {"v5litepod-4", "v5p-8"}),
        ("us-central2-b", {"v4-8", "v4-32"}, {"v5litepod-4"}),
    ],
)
def test_zones_offer_what_the_regions_page_lists(
    emulator: Emulator, zone: str, offered: set[str], refused: set[str]
) -> None:
    _, listed = call(emulator, "GET", f"/v2/projects/p/locations/{zone}/acceleratorTypes")
    names = {t["type"] for t in listed["acceleratorTypes"]}
    assert offered <= names
    assert not refused & names


def test_a_non_finite_value_set_in_process_still_gets_a_json_answer(emulator: Emulator) -> None:
    emulator.faults.preempt_after = float("inf")  # in-process writes bypass validation
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(emulator.url + "/_emulator/faults", timeout=10)
    assert caught.value.code == 500
    assert "not JSON" in _strict_json(caught.value.read())["error"]["message"]


def test_a_client_killed_mid_request_leaves_no_traceback(
    emulator: Emulator, capfd: pytest.CaptureFixture[str]
) -> None:
    import socket
    import struct

    from helpers import wait_until

    server = emulator._server
    assert server is not None
    host, port = emulator.url.removeprefix("http://").split(":")
    # A request whose body never comes, then a reset (SO_LINGER 0): what a tpulab killed
    # while sending looks like to the server. It once printed a ConnectionResetError
    # traceback on the served emulator's terminal.
    client = socket.create_connection((host, int(port)))
    client.sendall(b"POST /v2/projects/p/locations/z/nodes HTTP/1.1\r\nContent-Length: 99\r\n\r\n{")
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
    wait_until(lambda: getattr(server, "dropped_clients", 0) == 1, "the server saw the reset")
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err
    assert "ConnectionResetError" not in captured.err
