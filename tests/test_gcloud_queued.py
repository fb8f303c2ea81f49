"""The emulator's queued resources work unchanged with gcloud and google-cloud-tpu:
`gcloud compute tpus queued-resources create|describe|list|delete --force` against a
served emulator, checking gcloud's own output, and `TpuClient.create_queued_resource`
(REST) reading the same resources."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import require_tool, wait_until
from test_gcloud import gcloud_env

if TYPE_CHECKING:
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

pytestmark = pytest.mark.gcloud

ZONE = "us-central1-a"


def test_gcloud_queued_resources_create_describe_list_delete(
    emulator: Emulator, tmp_path: Path
) -> None:
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    env = gcloud_env(emulator, tmp_path / "gcloud-config")
    emulator.faults.capacity_after = {ZONE: 3600.0}  # capacity arrives below

    def gcloud(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["gcloud", "compute", "tpus", "queued-resources", *args, f"--zone={ZONE}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    created = gcloud(
        "create",
        "gc-qr",
        "--node-id=gc-qr-node",
        "--accelerator-type=v5litepod-4",
        "--runtime-version=v2-alpha-tpuv5-lite",
        "--valid-until-duration=1h",
        "--spot",
        "--metadata=ssh-keys=tpulab:ssh-ed25519 AAAAC3Nza tpulab",
    )
    assert created.returncode == 0, created.stderr
    assert "Created queued resource [gc-qr]" in created.stderr or "gc-qr" in created.stderr
    (sent,) = [r for r in emulator.requests() if r["method"] == "POST"]
    assert sent["path"].endswith(f"/locations/{ZONE}/queuedResources")
    assert ["queuedResourceId", "gc-qr"] in sent["query"]
    assert sent["body"]["queueingPolicy"] == {"validUntilDuration": "3600s"}
    assert sent["body"]["spot"] == {}
    (spec,) = sent["body"]["tpu"]["nodeSpec"]
    assert spec["nodeId"] == "gc-qr-node"
    assert spec["parent"] == f"projects/test-project/locations/{ZONE}"

    described = gcloud("describe", "gc-qr", "--format=json")
    assert described.returncode == 0, described.stderr
    qr = json.loads(described.stdout)
    assert qr["name"].endswith(f"/locations/{ZONE}/queuedResources/gc-qr")
    assert qr["state"]["state"] in {"ACCEPTED", "WAITING_FOR_RESOURCES"}
    assert qr["tpu"]["nodeSpec"][0]["node"]["acceleratorType"] == "v5litepod-4"

    emulator.faults.capacity_after = {}  # capacity arrives

    def active() -> bool:
        shown = json.loads(gcloud("describe", "gc-qr", "--format=json").stdout)
        return bool(shown["state"]["state"] == "ACTIVE")

    wait_until(active, "the queued resource to become ACTIVE")
    assert emulator.node_names() == ["gc-qr-node"]
    node = emulator.snapshot()["nodes"][f"test-project/{ZONE}/gc-qr-node"]
    assert node["spot"] is True  # the spot tier makes a spot node
    assert node["metadata"]["ssh-keys"].startswith("tpulab:ssh-ed25519")

    listed = gcloud("list")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.strip().splitlines()
    assert header.split() == [
        "NAME",
        "ZONE",
        "NODE_COUNT",
        "ACCELERATOR_TYPE",
        "TYPE",
        "TOPOLOGY",
        "STATE",
    ]
    assert row.split()[:4] == ["gc-qr", ZONE, "1", "v5litepod-4"]
    assert row.split()[-1] == "ACTIVE"

    # Without --force, a queued resource that still has its node is refused.
    refused = gcloud("delete", "gc-qr", "--quiet")
    assert refused.returncode != 0
    assert "FAILED_PRECONDITION" in refused.stderr
    assert emulator.node_names() == ["gc-qr-node"]

    deleted = gcloud("delete", "gc-qr", "--force", "--quiet")
    assert deleted.returncode == 0, deleted.stderr
    assert emulator.node_names() == []
    assert gcloud("list").stdout.strip() == ""
    missing = gcloud("describe", "gc-qr")
    assert missing.returncode != 0
    assert "NOT_FOUND" in missing.stderr


def test_tpu_client_create_queued_resource_over_rest(emulator: Emulator) -> None:
    """google-cloud-tpu's own TpuClient (REST transport, int enums) creates, reads, lists
    and force-deletes a queued resource, and sees FAILED with the reason at expiry."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2
    from google.protobuf import duration_pb2

    client = tpu_v2.TpuClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        transport="rest",
        client_options=ClientOptions(api_endpoint=emulator.url),
    )
    parent = f"projects/test-project/locations/{ZONE}"
    emulator.faults.capacity_after = {ZONE: 3600.0}  # never within the window below
    node = tpu_v2.Node(accelerator_type="v5litepod-4", runtime_version="v2-alpha-tpuv5-lite")
    resource = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[
                tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id="cl-node", node=node)
            ]
        ),
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=1)
        ),
    )
    operation = client.create_queued_resource(
        parent=parent, queued_resource=resource, queued_resource_id="cl-qr"
    )
    made = operation.result(timeout=20)  # type: ignore[no-untyped-call]
    assert made.name == f"{parent}/queuedResources/cl-qr"
    assert made.tpu.node_spec[0].node_id == "cl-node"

    def failed() -> bool:
        got = client.get_queued_resource(name=f"{parent}/queuedResources/cl-qr")
        return bool(got.state.state == tpu_v2.QueuedResourceState.State.FAILED)

    wait_until(failed, "the queued resource to fail")
    got = client.get_queued_resource(name=f"{parent}/queuedResources/cl-qr")
    assert "valid until" in got.state.failed_data.error.message
    assert emulator.node_names() == []  # never provisioned
    listed = list(client.list_queued_resources(parent=parent))
    assert [q.name.rsplit("/", 1)[-1] for q in listed] == ["cl-qr"]
    client.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(
            name=f"{parent}/queuedResources/cl-qr", force=True
        )
    ).result(timeout=20)  # type: ignore[no-untyped-call]
    assert list(client.list_queued_resources(parent=parent)) == []


def test_qr_state_numbers_match_the_client() -> None:
    from google.cloud import tpu_v2

    from tpulab.emulator.queued import QR_STATES

    states = tpu_v2.QueuedResourceState.State
    assert {name: int(getattr(states, name)) for name in states.__members__} == QR_STATES
