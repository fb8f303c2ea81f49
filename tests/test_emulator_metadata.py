"""Each emulated node's metadata server, and the API's answer to the node's own token.

Real parts only: the emulator's HTTP servers over loopback, stdlib urllib as the node's
code would use it, google-auth's own compute-engine credentials (in a subprocess, since
it reads GCE_METADATA_HOST at import), the google-cloud-tpu client and gcloud.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import require_tool

from tpulab.contract import DELETE_NODE_PERMISSION, METADATA_FLAVOR, METADATA_FLAVOR_HEADER
from tpulab.emulator import Emulator
from tpulab.emulator.metadata import metadata_tree

pytest_plugins = ["emulator_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"
NODES = f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes"


class Clock:
    """The emulator's clock, moved by the test (token lifetimes are an hour)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _call(
    url: str,
    method: str = "GET",
    body: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def _create(emulator: Emulator, name: str, **node: Any) -> None:
    body = {"acceleratorType": "v5litepod-4", "runtimeVersion": "v2-alpha-tpuv5-lite", **node}
    status, answer, _ = _call(f"{emulator.url}{NODES}?nodeId={name}", "POST", body)
    assert status == 200, answer


def _booted(emulator: Emulator, name: str) -> str:
    """The node's metadata server address, once it has booted."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        emulator.tick()
        node = emulator.snapshot()["nodes"].get(f"{PROJECT}/{ZONE}/{name}") or {}
        address = (node.get("guest") or {}).get("metadata")
        if address and node.get("state") == "READY":
            return str(address)
        time.sleep(0.05)
    raise AssertionError(f"node {name} never booted")


def _md(address: str, path: str, method: str = "GET", value: str | None = None) -> tuple[int, str]:
    status, body, headers = _call(
        f"http://{address}/computeMetadata/v1/{path}",
        method,
        headers={METADATA_FLAVOR_HEADER: METADATA_FLAVOR},
        raw=None if value is None else value.encode(),
    )
    assert headers.get(METADATA_FLAVOR_HEADER) == METADATA_FLAVOR, (path, headers)
    return status, body.decode()


def _token(address: str) -> str:
    status, body = _md(address, "instance/service-accounts/default/token")
    assert status == 200, body
    return str(json.loads(body)["access_token"])


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def guest_emulator(start_emulator: Any, tmp_path: Path) -> Emulator:
    emulator: Emulator = start_emulator(tmp_path / "state", guests=True)
    return emulator


def test_the_metadata_flavor_header_is_required(guest_emulator: Emulator) -> None:
    _create(guest_emulator, "n1")
    address = _booted(guest_emulator, "n1")
    url = f"http://{address}/computeMetadata/v1/project/project-id"
    status, body, headers = _call(url)
    assert status == 403
    assert b"Missing Metadata-Flavor:Google header" in body
    assert headers.get(METADATA_FLAVOR_HEADER) == METADATA_FLAVOR
    # GCE refuses proxied requests too (a forwarded request is not from the VM).
    forwarded = {METADATA_FLAVOR_HEADER: METADATA_FLAVOR, "X-Forwarded-For": "10.0.0.9"}
    assert _call(url, headers=forwarded)[0] == 403
    assert _md(address, "project/project-id") == (200, PROJECT)


def test_the_node_reads_its_identity(guest_emulator: Emulator) -> None:
    metadata = {"startup-script": "", "ssh-keys": "u:ssh-ed25519 AAAA u", "custom": "v 1"}
    _create(
        guest_emulator,
        "n1",
        metadata=metadata,
        serviceAccount={"email": "wd@test-project.iam.gserviceaccount.com", "scope": ["s1"]},
    )
    address = _booted(guest_emulator, "n1")
    node = guest_emulator.snapshot()["nodes"][f"{PROJECT}/{ZONE}/n1"]

    status, listing = _md(address, "instance/attributes/")
    assert status == 200
    keys = listing.splitlines()
    assert set(keys) >= {*metadata, "tpu-env", "accelerator-type", "agent-worker-number"}
    for key, value in metadata.items():
        assert _md(address, f"instance/attributes/{key}") == (200, value)
    status, everything = _md(address, "instance/attributes/?recursive=true")
    assert status == 200
    assert {k: v for k, v in json.loads(everything).items() if k in metadata} == metadata
    assert _md(address, "instance/attributes/no-such-key")[0] == 404

    # tpu-env parsed the way JAX's cloud_tpu_cluster parses it.
    status, tpu_env = _md(address, "instance/attributes/tpu-env")
    assert status == 200
    parsed = {}
    for line in tpu_env.splitlines():
        key, _, value = line.partition(":")
        parsed[key.strip()] = value.strip().strip("'")
    assert parsed["NODE_ID"] == "n1"
    assert parsed["WORKER_ID"] == "0"
    assert parsed["ZONE"] == ZONE
    assert parsed["CONSUMER_PROJECT_ID"] == PROJECT
    number = parsed["CONSUMER_PROJECT_NUMBER"]
    assert number.isdigit()

    assert _md(address, "instance/id") == (200, node["id"])
    assert _md(address, "instance/zone") == (200, f"projects/{number}/zones/{ZONE}")
    assert _md(address, "project/project-id") == (200, PROJECT)
    assert _md(address, "project/numeric-project-id") == (200, number)
    assert _md(address, "instance/preempted") == (200, "FALSE")
    name = _md(address, "instance/name")[1]
    assert name.startswith("t1v-n-")  # the VM's name, not the node's

    email = "wd@test-project.iam.gserviceaccount.com"
    account = "instance/service-accounts/default"
    assert _md(address, f"{account}/email") == (200, email)
    assert _md(address, f"{account}/scopes") == (200, "s1\n")
    status, info = _md(address, f"{account}/?recursive=true")
    assert json.loads(info) == {"aliases": ["default"], "email": email, "scopes": ["s1"]}
    assert _md(address, "instance/service-accounts/")[1].splitlines() == ["default/", f"{email}/"]

    status, token = _md(address, f"{account}/token")
    assert status == 200
    answer = json.loads(token)
    assert answer["token_type"] == "Bearer"
    assert 3000 < answer["expires_in"] <= 3599
    assert answer["access_token"].startswith("ya29.")
    # Also by the account's email, as GCE serves it; a foreign account is unknown.
    assert (
        json.loads(_md(address, f"instance/service-accounts/{email}/token")[1])["access_token"]
        == answer["access_token"]
    )
    assert _md(address, "instance/service-accounts/other@x.com/token")[0] == 404

    # The API shows the account asked for at create, as the real Node does.
    status, body, _ = _call(f"{guest_emulator.url}{NODES}/n1")
    assert json.loads(body)["serviceAccount"] == {"email": email, "scope": ["s1"]}


def test_a_default_node_has_the_default_compute_account_with_cloud_platform(
    guest_emulator: Emulator,
) -> None:
    _create(guest_emulator, "n1")
    address = _booted(guest_emulator, "n1")
    number = _md(address, "project/numeric-project-id")[1]
    account = "instance/service-accounts/default"
    assert _md(address, f"{account}/email") == (
        200,
        f"{number}-compute@developer.gserviceaccount.com",
    )
    assert _md(address, f"{account}/scopes") == (
        200,
        "https://www.googleapis.com/auth/cloud-platform\n",
    )


def test_preempted_reads_true_for_a_preempted_node() -> None:
    record = {
        "project": PROJECT,
        "zone": ZONE,
        "name": "n1",
        "id": "7000000000000001",
        "accelerator_type": "v5litepod-4",
        "runtime_version": "v2-alpha-tpuv5-lite",
        "metadata": {},
        "state": "PREEMPTED",
    }
    assert metadata_tree(record)["instance"]["preempted"] == "TRUE"
    assert metadata_tree({**record, "state": "READY"})["instance"]["preempted"] == "FALSE"


def test_google_auth_takes_the_token_and_project_from_it(guest_emulator: Emulator) -> None:
    """The real peer client: google-auth's compute-engine credentials, pointed here only
    by GCE_METADATA_HOST, as code on the emulated VM would be."""
    _create(guest_emulator, "n1")
    address = _booted(guest_emulator, "n1")
    probe = (
        "import json, google.auth.transport.requests as t\n"
        "from google.auth import compute_engine\n"
        "from google.auth.compute_engine import _metadata\n"
        "request = t.Request()\n"
        "assert _metadata.ping(request), 'not seen as a metadata server'\n"
        "credentials = compute_engine.Credentials()\n"
        "credentials.refresh(request)\n"
        "print(json.dumps({'token': credentials.token, 'email': credentials.service_account_email,"
        " 'project': _metadata.get_project_id(request)}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GCE_")}
    env.pop("NO_GCE_CHECK", None)
    env["GCE_METADATA_HOST"] = address
    env["GCE_METADATA_IP"] = address
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["project"] == PROJECT
    assert seen["email"].endswith("-compute@developer.gserviceaccount.com")
    # The token it got is one the API accepts as this node's.
    granted = _call(
        f"{guest_emulator.url}/v1/projects/{PROJECT}:testIamPermissions",
        "POST",
        {"permissions": [DELETE_NODE_PERMISSION]},
        _bearer(seen["token"]),
    )
    assert granted[0] == 200
    assert json.loads(granted[1]) == {"permissions": [DELETE_NODE_PERMISSION]}


def test_the_node_token_deletes_its_node(guest_emulator: Emulator) -> None:
    _create(guest_emulator, "n1")
    token = _token(_booted(guest_emulator, "n1"))
    url = guest_emulator.url
    asked = ["tpu.nodes.get", DELETE_NODE_PERMISSION, "compute.instances.setIamPolicy"]
    status, body, _ = _call(
        f"{url}/v1/projects/{PROJECT}:testIamPermissions",
        "POST",
        {"permissions": asked},
        _bearer(token),
    )
    assert status == 200
    assert json.loads(body) == {"permissions": ["tpu.nodes.get", DELETE_NODE_PERMISSION]}

    # A token the metadata server never issued is refused, not taken for the controller.
    forged = _call(f"{url}{NODES}/n1", "DELETE", headers=_bearer("ya29.tpulab-emulated.00"))
    assert forged[0] == 401
    assert json.loads(forged[1])["error"]["status"] == "UNAUTHENTICATED"

    status, body, _ = _call(f"{url}{NODES}/n1", "DELETE", headers=_bearer(token))
    assert status == 200, body
    assert json.loads(body)["metadata"]["verb"] == "delete"
    deadline = time.monotonic() + 10
    while "n1" in guest_emulator.node_names() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guest_emulator.node_names() == []
    # The request log tells the node's own calls from the controller's.
    callers = [(r["method"], r.get("caller")) for r in guest_emulator.requests()]
    node = f"projects/{PROJECT}/locations/{ZONE}/nodes/n1"
    assert callers == [
        ("POST", None),  # the create, by the controller
        ("POST", node),  # testIamPermissions
        ("DELETE", "an invalid or expired node token"),
        ("DELETE", node),
    ]


def test_without_the_delete_permission_the_node_token_gets_the_real_403(
    guest_emulator: Emulator,
) -> None:
    guest_emulator.faults.update({"node_identity_cannot_delete": True})
    _create(guest_emulator, "n1")
    token = _token(_booted(guest_emulator, "n1"))
    url = guest_emulator.url
    status, body, _ = _call(
        f"{url}/v1/projects/{PROJECT}:testIamPermissions",
        "POST",
        {"permissions": ["tpu.nodes.get", DELETE_NODE_PERMISSION]},
        _bearer(token),
    )
    assert (status, json.loads(body)) == (200, {"permissions": ["tpu.nodes.get"]})

    status, body, _ = _call(f"{url}{NODES}/n1", "DELETE", headers=_bearer(token))
    assert status == 403
    error = json.loads(body)["error"]
    assert error["status"] == "PERMISSION_DENIED"
    assert error["message"] == (
        f"Permission 'tpu.nodes.delete' denied on 'projects/{PROJECT}/locations/{ZONE}/nodes/n1'"
    )
    assert error["details"][0]["reason"] == "IAM_PERMISSION_DENIED"
    assert error["details"][0]["metadata"]["permission"] == DELETE_NODE_PERMISSION
    assert guest_emulator.node_names() == ["n1"]
    # The node may still read itself, and the controller (no token) still deletes it.
    assert _call(f"{url}{NODES}/n1", headers=_bearer(token))[0] == 200
    assert _call(f"{url}{NODES}/n1", "DELETE")[0] == 200


def test_the_fault_can_name_single_nodes(guest_emulator: Emulator) -> None:
    guest_emulator.faults.update({"node_identity_cannot_delete_nodes": ["denied"]})
    _create(guest_emulator, "denied")
    _create(guest_emulator, "allowed")
    url = guest_emulator.url
    answers = {}
    for name in ("denied", "allowed"):
        token = _token(_booted(guest_emulator, name))
        answers[name] = _call(f"{url}{NODES}/{name}", "DELETE", headers=_bearer(token))[0]
    assert answers == {"denied": 403, "allowed": 200}


def test_each_node_sees_only_itself(guest_emulator: Emulator) -> None:
    _create(guest_emulator, "a")
    _create(guest_emulator, "b")
    address_a, address_b = _booted(guest_emulator, "a"), _booted(guest_emulator, "b")
    assert address_a != address_b
    assert "NODE_ID: 'a'" in _md(address_a, "instance/attributes/tpu-env")[1]
    assert "NODE_ID: 'b'" in _md(address_b, "instance/attributes/tpu-env")[1]
    token_a = _token(address_a)
    assert token_a != _token(address_b)
    # A's identity is the project's: in another project it may do nothing.
    status, body, _ = _call(
        f"{guest_emulator.url}/v2/projects/other-project/locations/{ZONE}/nodes/a",
        "DELETE",
        headers=_bearer(token_a),
    )
    assert status == 403
    assert json.loads(body)["error"]["status"] == "PERMISSION_DENIED"


def test_tokens_rotate_before_they_expire_and_then_stop_working(
    start_emulator: Any, tmp_path: Path
) -> None:
    clock = Clock()
    emulator: Emulator = start_emulator(tmp_path / "state", guests=True, clock=clock)
    _create(emulator, "n1")
    clock.now += 1  # past create_seconds of Timing.fast()
    address = _booted(emulator, "n1")
    first = _token(address)
    clock.now += 3000
    assert json.loads(_md(address, "instance/service-accounts/default/token")[1]) == {
        "access_token": first,
        "expires_in": 599,
        "token_type": "Bearer",
    }
    clock.now += 400  # under five minutes left: the server hands out a fresh one
    second = _token(address)
    assert second != first
    check = f"{emulator.url}{NODES}/n1"
    assert _call(check, headers=_bearer(first))[0] == 200  # still valid for ~200 s
    clock.now += 300
    assert _call(check, headers=_bearer(first))[0] == 401  # expired
    assert _call(check, headers=_bearer(second))[0] == 200


def test_guest_attribute_writes_reach_the_tpu_api(guest_emulator: Emulator) -> None:
    from emulator_fixtures import api_for

    _create(guest_emulator, "n1")
    address = _booted(guest_emulator, "n1")
    assert _md(address, "instance/guest-attributes/tpulab/watchdog", "PUT", "armed") == (200, "")
    assert _md(address, "instance/guest-attributes/tpulab/watchdog") == (200, "armed")
    assert _md(address, "instance/guest-attributes/tpulab/")[1] == "watchdog\n"
    # As GCE: not in recursive dumps, yet readable as a directory of their own.
    assert "guestAttributes" not in json.loads(_md(address, "instance/?recursive=true")[1])
    assert "guestAttributes" not in json.loads(_md(address, "?recursive=true")[1])["instance"]
    everything = _md(address, "instance/guest-attributes/?recursive=true")[1]
    assert json.loads(everything) == {"tpulab": {"watchdog": "armed"}}
    # Only namespace/key is writable.
    assert _md(address, "instance/attributes/ssh-keys", "PUT", "x")[0] == 405

    api = api_for(guest_emulator, project=PROJECT)  # the google-cloud-tpu REST client
    assert api.guest_attributes(ZONE, "n1", "tpulab/") == {"tpulab/watchdog": "armed"}
    assert api.guest_attributes(ZONE, "n1", "tpulab/watchdog") == {"tpulab/watchdog": "armed"}
    _md(address, "instance/guest-attributes/tpulab/watchdog", "DELETE")
    assert api.guest_attributes(ZONE, "n1", "tpulab/") == {}


@pytest.mark.gcloud
def test_gcloud_reads_a_written_guest_attribute(guest_emulator: Emulator, tmp_path: Path) -> None:
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    _create(guest_emulator, "n1")
    address = _booted(guest_emulator, "n1")
    _md(address, "instance/guest-attributes/tpulab/watchdog", "PUT", "no-permission: x")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
    env.update(
        CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=guest_emulator.url + "/",
        CLOUDSDK_AUTH_DISABLE_CREDENTIALS="true",
        CLOUDSDK_CORE_PROJECT=PROJECT,
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud-config"),
        CLOUDSDK_CORE_DISABLE_PROMPTS="1",
        CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
        CLOUDSDK_CORE_DISABLE_USAGE_REPORTING="true",
    )
    done = subprocess.run(
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "get-guest-attributes",
            "n1",
            f"--zone={ZONE}",
            "--query-path=tpulab/",
            "--format=value(namespace,key,worker_id,value)",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # gcloud flattens the answer to one row per worker and attribute.
    assert done.stdout.splitlines() == ["tpulab\twatchdog\t0\tno-permission: x"]


def test_a_stopped_vm_publishes_nothing_while_its_state_still_says_ready() -> None:
    """A preempted VM's processes may outlive its stop until the server's next tick (that
    is when its host is stopped). What the VM publishes is written only while it runs,
    through the notice period, never after its stop, even though its state lags at READY
    (CI once saw a watchdog's `tpulab/preempted` land after a no-notice stop)."""
    from collections.abc import Iterator
    from contextlib import contextmanager

    from tpulab.emulator import FaultPlan, Timing
    from tpulab.emulator.guest import StateLink
    from tpulab.emulator.state import CloudState, node_key

    timing = Timing(create_seconds=1.0, delete_seconds=1.0, stockout_seconds=1.0)
    faults = FaultPlan(preempt_after=10.0, preempt_notice=5.0, preempt_state_lag=1e6)
    cloud = CloudState({"nodes": {}, "operations": {}, "next_id": 1}, timing, faults)
    clock = Clock()
    start = clock.now
    body = {
        "acceleratorType": "v5litepod-4",
        "runtimeVersion": "v2-alpha-tpuv5-lite",
        "schedulingConfig": {"spot": True},
    }
    cloud.create_node(PROJECT, ZONE, "n1", body, start)
    key = node_key(PROJECT, ZONE, "n1")

    @contextmanager
    def transaction() -> Iterator[CloudState]:
        cloud.advance(clock.now)  # as the server's own transactions do
        yield cloud

    link = StateLink(key, transaction, clock)

    def published() -> dict[str, str]:
        return dict(cloud.nodes[key].get("guest_attributes") or {})

    clock.now = start + 2  # READY, before any notice
    assert link.set_guest_attribute("tpulab/watchdog", "armed")
    clock.now = start + 12  # noticed (instance/preempted TRUE), still running
    assert link.set_guest_attribute("tpulab/preempted", "TRUE")
    assert cloud.nodes[key].get("preempt_notice_at") is not None
    assert cloud.nodes[key].get("vm_stopped_at") is None
    clock.now = start + 17  # stopped; the state lags at READY
    assert link.set_guest_attribute("tpulab/late", "x") is False
    assert cloud.nodes[key]["state"] == "READY"
    assert published() == {"tpulab/watchdog": "armed", "tpulab/preempted": "TRUE"}
