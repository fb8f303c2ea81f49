"""The Compute Engine provider (tpulab.cloud.compute_v1), through the CLI's dry run: the
plan is ComputeTpuApi over the recording transport, so the instances.insert it shows is
the one a real run sends. Its body is checked against gcloud's own Compute v1 message
classes (every field name must exist there), and wrong provider pairs are refused with
exit 2 before anything is sent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import tpulab

from tpulab import errors as E
from tpulab.cloud.classify import compute_error, scope_of
from tpulab.cloud.compute_v1 import instance_from_json, label_filter
from tpulab.models import NodeState

GCLOUD_LIB = Path("/usr/lib/google-cloud-sdk/lib")
DEAD_ENDPOINT = "http://127.0.0.1:9"  # discard port: nothing listens, nothing is sent


def _plan(*flags: str) -> dict[str, Any]:
    result = tpulab(
        "run", "--project", "p", "--zone", "us-central1-c", "--dry-run", "--json", *flags
    )
    assert result.returncode == 0, result.stderr[-2000:]
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan


def _steps(plan: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [step for step in plan["steps"] if step["action"] == action]


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    return {item["key"]: item["value"] for item in body["metadata"]["items"]}


def test_tpu7x_defaults_to_compute_and_the_plan_inserts_an_instance() -> None:
    plan = _plan("--accelerator", "tpu7x-8")
    (insert,) = _steps(plan, "compute.instances.insert")
    assert insert["method"] == "POST"
    assert insert["path"] == "/compute/v1/projects/p/zones/us-central1-c/instances"
    body = insert["body"]
    assert body["machineType"] == "zones/us-central1-c/machineTypes/tpu7x-standard-4t"
    assert body["name"] == plan["node_name"]
    assert body["labels"]["managed-by"] == "tpulab"
    assert body["labels"]["tpulab-run"] == plan["run_id"]
    metadata = _metadata(body)
    assert metadata["enable-oslogin"] == "FALSE"
    assert metadata["enable-guest-attributes"] == "TRUE"
    assert metadata["ssh-keys"].startswith("tpulab:ssh-ed25519 ")
    assert "startup-script" in metadata
    assert body["networkInterfaces"] == [
        {"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}
    ]
    assert body["serviceAccounts"][0]["scopes"] == [
        "https://www.googleapis.com/auth/cloud-platform"
    ]
    # On demand: no provisioning model, and no live migration (an accelerator VM's only
    # host-maintenance behaviour, said rather than left to Compute's MIGRATE default).
    assert body["scheduling"] == {"onHostMaintenance": "TERMINATE"}
    assert plan["sources"]["provider"] == "default for tpu7x-8"
    # The rest of the run is the Compute verbs too: wait, read, guest attributes, delete.
    actions = [step["action"] for step in plan["steps"] if step["kind"] == "api"]
    assert "compute.zoneOperations.get" in actions
    assert "compute.instances.getGuestAttributes" in actions
    assert "compute.instances.delete" in actions
    # Before them, only the project's checks (Service Usage: Compute enabled; Resource
    # Manager: the permissions); nothing is asked of the Cloud TPU API.
    before_insert = actions[: actions.index("compute.instances.insert")]
    assert before_insert == ["GetService", "TestIamPermissions"], actions
    paths = [str(step.get("path")) for step in plan["steps"] if step["kind"] == "api"]
    assert "/services/compute.googleapis.com" in paths[0], paths
    assert not [a for a in actions[len(before_insert) :] if not a.startswith("compute.")]
    assert not [p for p in paths if "/v2/projects/" in p or "tpu.googleapis.com" in p], paths


def test_v6e_on_compute_by_flag_spot_internal_and_an_image() -> None:
    image = "projects/p/global/images/my-tpu-image"
    plan = _plan(
        "--accelerator", "v6e-4", "--provider", "compute", "--spot", "--internal-ip",
        "--image", image, "--network", "lab-vpc",
    )  # fmt: skip
    (insert,) = _steps(plan, "compute.instances.insert")
    body = insert["body"]
    assert body["machineType"].endswith("/ct6e-standard-4t")
    assert body["disks"][0]["initializeParams"]["sourceImage"] == image
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["networkInterfaces"] == [{"network": "projects/p/global/networks/lab-vpc"}]
    assert plan["sources"]["provider"] == "--provider"


def test_v6e_without_a_flag_stays_on_the_tpu_api() -> None:
    plan = _plan("--accelerator", "v6e-4")
    assert _steps(plan, "CreateNode")
    assert not _steps(plan, "compute.instances.insert")


@pytest.mark.parametrize(
    ("accelerator", "provider", "words"),
    [
        ("tpu7x-8", "tpu-api", "not served by the tpu-api provider"),
        ("v5litepod-4", "compute", "not served by the compute provider"),
        ("v6e-16", "compute", "multi-host slice"),
        ("v6e-4", "gke", "Unknown provider"),
    ],
)
def test_a_wrong_pair_is_refused_before_anything_is_sent(
    accelerator: str, provider: str, words: str
) -> None:
    # A real run at an endpoint where nothing listens: any request would fail as
    # unreachable (not exit 2), so exit 2 with these words means none was sent.
    result = tpulab(
        "run", "--accelerator", accelerator, "--provider", provider, "--project", "p",
        "--zone", "us-central1-c", "--api-endpoint", DEAD_ENDPOINT, "--image", "i",
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in " ".join((result.stdout + result.stderr).split())


def test_a_real_compute_run_without_an_image_is_refused() -> None:
    result = tpulab(
        "run", "--accelerator", "tpu7x-8", "--project", "p", "--zone", "us-central1-c",
        "--api-endpoint", DEAD_ENDPOINT,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--image" in result.stdout + result.stderr


def test_a_compute_session_without_an_image_is_refused_before_anything_is_sent() -> None:
    # `up` keeps a TPU7x (Compute only) as an instance, which needs a boot image: none
    # given is refused as `run` refuses it, before any request or session file.
    result = tpulab(
        "up", "--accelerator", "tpu7x-8", "--project", "p", "--zone", "us-central1-c",
        "--api-endpoint", DEAD_ENDPOINT,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--image" in result.stdout + result.stderr
    sessions = Path(os.environ["TPULAB_HOME"]) / "state" / "sessions"
    assert not sessions.exists() or not any(sessions.iterdir())


_VALIDATE = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/third_party"]
from apitools.base.py import encoding
from apitools.base.protorpclite import messages
from googlecloudsdk.generated_clients.apis.compute.v1 import compute_v1_messages as m

def unknown(message, where):
    found = [where + "." + name for name in message.all_unrecognized_fields()]
    for field in message.all_fields():
        if isinstance(field, messages.MessageField):
            value = message.get_assigned_value(field.name)
            for item in (value if field.repeated else [value]) if value is not None else []:
                found += unknown(item, where + "." + field.name)
    return found

instance = encoding.JsonToMessage(m.Instance, sys.stdin.read())
print(json.dumps(unknown(instance, "Instance")))
"""


def test_the_insert_body_is_an_instance_to_gclouds_own_message_classes() -> None:
    if not (GCLOUD_LIB / "googlecloudsdk").is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("gcloud's SDK is missing on CI")
        pytest.skip("gcloud's SDK (its generated Compute v1 messages) is not installed")
    plan = _plan("--accelerator", "v6e-4", "--provider", "compute", "--spot")
    (insert,) = _steps(plan, "compute.instances.insert")
    python = shutil.which("python3") or sys.executable
    checked = subprocess.run(
        [python, "-c", _VALIDATE, str(GCLOUD_LIB)],
        input=json.dumps(insert["body"]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr[-2000:]  # bad enum values raise
    assert json.loads(checked.stdout) == []
    # And a misspelt field is caught, so the check can fail.
    wrong = {**insert["body"], "machinetype": "x"}
    caught = subprocess.run(
        [python, "-c", _VALIDATE, str(GCLOUD_LIB)],
        input=json.dumps(wrong),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(caught.stdout) == ["Instance.machinetype"]


def test_compute_operation_errors_go_through_the_one_table() -> None:
    # ZONE_RESOURCE_POOL_EXHAUSTED's message names neither "capacity" nor "stockout"
    # (gcloud prints it as "code: ZONE_RESOURCE_POOL_EXHAUSTED"): its code decides.
    stockout = compute_error(
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "The zone 'projects/p/zones/us-central1-c' does not have enough resources "
        "available to fulfill the request.  Try a different zone, or try again later.",
        "insert instance n in us-central1-c",
        http_status=503,
    )
    assert isinstance(stockout, E.StockoutError)
    assert scope_of(stockout) == "zone"
    detailed = compute_error("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "", "insert")
    assert isinstance(detailed, E.StockoutError)
    # A quota said to be regional skips the region's zones, as the TPU API's does.
    quota = compute_error(
        "QUOTA_EXCEEDED",
        "Quota 'N2D_CPUS' exceeded. Limit: 0.0 in region us-central1.",
        "insert instance n in us-central1-c",
        http_status=403,
    )
    assert isinstance(quota, E.QuotaError)
    assert scope_of(quota) == "region"


def test_an_instance_reads_as_a_node() -> None:
    node = instance_from_json(
        {
            "name": "n",
            "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-c",
            "machineType": "zones/us-central1-c/machineTypes/tpu7x-standard-4t",
            "status": "TERMINATED",
            "labels": {"managed-by": "tpulab", "tpulab-run": "r"},
            "scheduling": {"provisioningModel": "SPOT"},
            "networkInterfaces": [
                {"networkIP": "10.0.0.2", "accessConfigs": [{"natIP": "34.1.2.3"}]}
            ],
            "metadata": {"items": [{"key": "enable-oslogin", "value": "FALSE"}]},
        },
        "p",
        "fallback-zone",
    )
    assert (node.zone, node.state, node.spot) == ("us-central1-c", NodeState.TERMINATED, True)
    assert (node.ip_address, node.external_ip, node.run_id) == ("10.0.0.2", "34.1.2.3", "r")
    assert node.managed_by_tpulab
    assert node.metadata == {"enable-oslogin": "FALSE"}
    assert label_filter() == 'labels.managed-by = "tpulab"'
