"""A Compute run's preflight, and the emulated project's Compute side it asks.

`tpulab run` on the Compute provider asks, before its first instances.insert, whether
compute.googleapis.com is enabled and whether the caller holds what the run needs
(tpulab.app.doctor.preflight_for): a project that cannot run is refused with exit 2 and
its fix, and nothing is created (no insert call, no instance). The emulator's answers
the preflight reads are pinned here too: Service Usage knows compute.googleapis.com, a
denied compute.* permission is the `caller_lacks` fault, a disabled Compute API answers
Compute's own 403, and machineTypes.get answers the zone's types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import requests
from emulator_fixtures import node_request
from helpers import tpulab

from tpulab.app.doctor import run_preflight
from tpulab.app.target import compute_api
from tpulab.cloud.preflight import refuse_on_problems
from tpulab.emulator.iam import project_number
from tpulab.errors import CloudError, ConfigError

if TYPE_CHECKING:
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"
IMAGE = "projects/p/global/images/tpu-vm-test-image"
DISABLED = {"disabled_services": ["compute.googleapis.com"]}


def _get(emulator: Emulator, path: str) -> tuple[int, dict[str, Any]]:
    answer = requests.get(f"{emulator.url}/{path}", timeout=10)
    return answer.status_code, answer.json()


def _refused_before_the_insert(emulator: Emulator) -> None:
    assert emulator.calls["insert_instance"] == 0
    assert emulator.instance_names() == []


# -- the preflight ---------------------------------------------------------------------


def test_the_compute_preflight_asks_computes_api_and_permissions(emulator: Emulator) -> None:
    ok = run_preflight(PROJECT, api_endpoint=emulator.url, provider="compute")
    assert [(c.name, c.status) for c in ok] == [("compute-api", "ok"), ("permissions", "ok")]
    refuse_on_problems(ok)  # nothing to refuse
    paths = [r["path"] for r in emulator.requests()]
    assert paths == [
        f"/v1/projects/{PROJECT}/services/compute.googleapis.com",
        f"/v1/projects/{PROJECT}:testIamPermissions",
    ]

    emulator.faults.update(DISABLED)
    with pytest.raises(ConfigError, match="Compute Engine API is not enabled") as refused:
        refuse_on_problems(run_preflight(PROJECT, api_endpoint=emulator.url, provider="compute"))
    assert f"gcloud services enable compute.googleapis.com --project {PROJECT}" in (
        refused.value.hint or ""
    )


@pytest.mark.parametrize(
    ("faults", "words"),
    [
        (DISABLED, "gcloud services enable compute.googleapis.com"),
        ({"caller_lacks": ["compute.instances.create"]}, "roles/compute.instanceAdmin.v1"),
    ],
    ids=["compute-api-disabled", "caller-lacks-create"],
)
def test_a_compute_run_is_refused_before_its_insert(
    emulator: Emulator, faults: dict[str, Any], words: str
) -> None:
    emulator.faults.update(faults)

    done = tpulab(
        "run", "--accelerator", "tpu7x-8", "--image", IMAGE, "--api-endpoint", emulator.url,
        "--project", PROJECT, "--zone", ZONE,
    )  # fmt: skip

    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert words in said
    assert "tpulab doctor" in said
    _refused_before_the_insert(emulator)
    assert emulator.calls["get_service"] == emulator.calls["test_iam_permissions"] == 1


def test_a_compute_dry_run_plans_the_compute_preflight(emulator: Emulator) -> None:
    done = tpulab("run", "--accelerator", "tpu7x-8", "--emulate", "--dry-run")

    assert done.returncode == 0, done.stderr
    assert "services/compute.googleapis.com" in done.stdout
    assert "services/tpu.googleapis.com" not in done.stdout
    assert ":testIamPermissions" in done.stdout


# -- the emulated project's Compute side -----------------------------------------------


def test_service_usage_knows_compute_enabled_by_default_and_disabled_by_the_fault(
    emulator: Emulator,
) -> None:
    path = f"v1/projects/{PROJECT}/services/compute.googleapis.com"
    status, body = _get(emulator, path)
    assert status == 200
    assert body["state"] == "ENABLED"
    assert body["config"] == {"name": "compute.googleapis.com", "title": "Compute Engine API"}
    assert body["parent"] == f"projects/{project_number(PROJECT)}"

    emulator.faults.update(DISABLED)
    assert _get(emulator, path)[1]["state"] == "DISABLED"
    # The Cloud TPU API stays enabled: one service's switch is not another's.
    assert _get(emulator, f"v1/projects/{PROJECT}/services/tpu.googleapis.com")[1]["state"] == (
        "ENABLED"
    )


@pytest.mark.parametrize(
    "path",
    [
        f"compute/v1/projects/{PROJECT}/zones/{ZONE}/instances",
        f"compute/v1/projects/{PROJECT}/global/networks/default",
        f"compute/v1/projects/{PROJECT}/global/firewalls",
        f"compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes/tpu7x-standard-4t",
    ],
)
def test_a_disabled_compute_api_answers_its_403_access_not_configured(
    emulator: Emulator, path: str
) -> None:
    emulator.faults.update(DISABLED)

    status, body = _get(emulator, path)

    number = project_number(PROJECT)
    assert status == 403
    error = body["error"]
    assert error["code"] == 403
    assert error["message"].startswith(
        f"Compute Engine API has not been used in project {number} before or it is disabled."
    )
    assert f"compute.googleapis.com/overview?project={number}" in error["message"]
    assert error["errors"] == [
        {"message": error["message"], "domain": "usageLimits", "reason": "accessNotConfigured"}
    ]
    (info,) = error["details"]
    assert (info["reason"], info["metadata"]["service"]) == (
        "SERVICE_DISABLED",
        "compute.googleapis.com",
    )


def test_the_controller_reads_a_disabled_compute_api_as_permission_denied(
    emulator: Emulator,
) -> None:
    """Without the preflight (it could not be asked), the insert itself meets the 403:
    tpulab's error quotes Compute's words and nothing is created."""
    emulator.faults.update(DISABLED)
    api = compute_api(PROJECT, api_endpoint=emulator.url, image=IMAGE, retry_for=0.0)

    with pytest.raises(CloudError) as refused:
        api.create_node(ZONE, "n1", node_request("tpu7x-8"))

    assert refused.value.status == "PERMISSION_DENIED"
    assert "Compute Engine API has not been used" in (refused.value.api_message or "")
    assert emulator.instance_names() == []


def test_a_denied_compute_permission_is_omitted_and_refused(emulator: Emulator) -> None:
    emulator.faults.update({"caller_lacks": ["compute.instances.create"]})

    asked = ["compute.instances.create", "compute.disks.create", "compute.instances.get"]
    answer = requests.post(
        f"{emulator.url}/v1/projects/{PROJECT}:testIamPermissions",
        json={"permissions": asked},
        timeout=10,
    )
    assert answer.json() == {"permissions": ["compute.disks.create", "compute.instances.get"]}
    api = compute_api(PROJECT, api_endpoint=emulator.url, image=IMAGE, retry_for=0.0)
    with pytest.raises(CloudError) as refused:
        api.create_node(ZONE, "n1", node_request("tpu7x-8"))
    assert "Required 'compute.instances.create' permission" in (refused.value.api_message or "")
    assert emulator.instance_names() == []


def test_machine_types_get_answers_the_zones_types_and_404_for_the_rest(
    emulator: Emulator,
) -> None:
    root = f"compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes"
    status, body = _get(emulator, f"{root}/ct6e-standard-4t")
    assert status == 200
    assert (body["kind"], body["name"], body["zone"]) == (
        "compute#machineType",
        "ct6e-standard-4t",
        ZONE,
    )

    emulator.faults.update({"absent_machine_types": [f"{ZONE}/tpu7x-standard-4t"]})
    for name in ("tpu7x-standard-4t", "n9-imaginary-8"):
        status, body = _get(emulator, f"{root}/{name}")
        assert status == 404
        resource = f"projects/{PROJECT}/zones/{ZONE}/machineTypes/{name}"
        assert body["error"]["message"] == f"The resource '{resource}' was not found"
        assert body["error"]["errors"][0]["reason"] == "notFound"
    # The insert agrees with machineTypes.get: a type the zone lacks is refused (400).
    api = compute_api(PROJECT, api_endpoint=emulator.url, image=IMAGE, retry_for=0.0)
    with pytest.raises(CloudError) as refused:
        api.create_node(ZONE, "n1", node_request("tpu7x-8"))
    assert "Machine type with name 'tpu7x-standard-4t' does not exist in zone" in (
        refused.value.api_message or ""
    )
    assert emulator.instance_names() == []
