"""`tpulab doctor` for the Compute Engine provider, against a served emulator.

A Compute-only type (tpu7x-8), or `--provider compute`, is checked on Compute's side:
compute.googleapis.com enabled (Service Usage), Compute's permissions
(testIamPermissions), the VM account's delete role (getIamPolicy), the network, and the
zone's machine type (machineTypes.get). Each negative answer is the emulator's own fault
(tpulab/emulator/faults.py), answered in the real APIs' shapes; every case also checks
that nothing was created.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
from helpers import tpulab

from tpulab.app.doctor import DoctorEnvelope, doctor
from tpulab.cloud.preflight import COMPUTE_RUN_PERMISSIONS, RUN_PERMISSIONS
from tpulab.config.doctor import doctor_inputs
from tpulab.emulator.iam import project_number
from tpulab.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

    from tpulab.cloud.preflight import Check
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"
COMPUTE_ACCOUNT = f"{project_number(PROJECT)}-compute@developer.gserviceaccount.com"
CALLER = "user:owner@tpulab-emulator.example"
# What a Compute check may send: Service Usage, Resource Manager, Compute reads.
_READS = re.compile(
    r"^/(v1/projects/[^/]+(:testIamPermissions|:getIamPolicy|/services/.+)|tokeninfo|compute/v1/.+)$"
)


def _checks(
    emulator: Emulator, tmp_path: Path, accelerator: str | None = "tpu7x-8", **flags: Any
) -> dict[str, Check]:
    """doctor's checks by name, asked in-process as the CLI asks them."""
    inputs = doctor_inputs(
        project=PROJECT,
        zone=flags.pop("zone", ZONE),
        accelerator=accelerator,
        service_account=flags.pop("service_account", None),
        emulate=False,
        api_endpoint=emulator.url,
        env={},
        cwd=tmp_path,  # no workspace file names a provider
        **flags,
    )
    _account, checks = doctor(inputs)
    return {check.name: check for check in checks}


def _created_nothing(emulator: Emulator) -> None:
    assert emulator.calls["insert_instance"] == emulator.calls["create_node"] == 0
    for request in emulator.requests():
        assert request["method"] == "GET" or _READS.match(request["path"]), request
    assert emulator.instance_names() == []


def _asked_permissions(emulator: Emulator) -> list[str]:
    (asked,) = [r for r in emulator.requests() if r["path"].endswith(":testIamPermissions")]
    return list(asked["body"]["permissions"])


def test_a_ready_project_passes_computes_checks_for_tpu7x(
    emulator: Emulator, tmp_path: Path
) -> None:
    checks = _checks(emulator, tmp_path)

    assert list(checks) == [
        "credentials", "project", "compute-api", "permissions", "vm-account", "network",
        "machine-type",
    ]  # fmt: skip
    assert all(check.status == "ok" for check in checks.values()), checks
    assert "Compute Engine API is enabled" in checks["compute-api"].summary
    assert "tpu7x-standard-4t" in checks["machine-type"].summary
    assert f"{COMPUTE_ACCOUNT} holds roles/editor" in checks["vm-account"].summary
    # Compute's side was asked, not the TPU API's.
    paths = [r["path"] for r in emulator.requests()]
    assert f"/v1/projects/{PROJECT}/services/compute.googleapis.com" in paths
    assert not any("tpu.googleapis.com" in path for path in paths)
    assert emulator.calls["get_machine_type"] == 1
    assert f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes/tpu7x-standard-4t" in paths
    asked = _asked_permissions(emulator)
    assert set(COMPUTE_RUN_PERMISSIONS) <= set(asked)
    assert "compute.subnetworks.useExternalIp" in asked  # a VM with an external IP
    assert not set(RUN_PERMISSIONS) & set(asked)
    _created_nothing(emulator)


FAULTS: list[Any] = [
    pytest.param(
        {"disabled_services": ["compute.googleapis.com"]},
        "compute-api",
        "gcloud services enable compute.googleapis.com --project test-project",
        id="compute-api-disabled",
    ),
    pytest.param(
        {"caller_lacks": ["compute.disks.create"]},
        "permissions",
        f"gcloud projects add-iam-policy-binding test-project --member={CALLER} "
        "--role=roles/compute.instanceAdmin.v1",
        id="caller-lacks-disks-create",
    ),
    pytest.param(
        {"node_identity_cannot_delete": True},
        "vm-account",
        f"--member=serviceAccount:{COMPUTE_ACCOUNT} --role=roles/compute.instanceAdmin.v1",
        id="vm-account-cannot-delete",
    ),
    pytest.param(
        {"absent_machine_types": [f"{ZONE}/tpu7x-standard-4t"]},
        "machine-type",
        "gcloud compute machine-types list --project test-project "
        "--filter=name=tpu7x-standard-4t --format='value(zone)'",
        id="zone-lacks-machine-type",
    ),
]


@pytest.mark.parametrize(("faults", "check", "fix"), FAULTS)
def test_each_negative_answer_is_a_compute_problem_with_its_fix(
    emulator: Emulator, tmp_path: Path, faults: dict[str, Any], check: str, fix: str
) -> None:
    emulator.faults.update(faults)

    checks = _checks(emulator, tmp_path)

    assert checks[check].status == "problem", checks
    assert fix in (checks[check].fix or "")
    others = [name for name in checks if name != check]
    assert all(checks[name].status != "problem" for name in others), checks
    _created_nothing(emulator)


def test_a_disabled_compute_api_leaves_the_network_unknown_not_a_problem(
    emulator: Emulator, tmp_path: Path
) -> None:
    """Compute answers its 403 accessNotConfigured to networks.get too: what the network
    is cannot be known, which is not a second problem."""
    emulator.faults.update({"disabled_services": ["compute.googleapis.com"]})

    checks = _checks(emulator, tmp_path)

    assert checks["network"].status == "unknown"
    assert "HTTP 403" in checks["network"].summary
    assert "Compute Engine API has not been used" in checks["network"].summary
    assert checks["machine-type"].status == "unknown"


def test_the_missing_permission_is_named_and_internal_ip_asks_no_external_ip(
    emulator: Emulator, tmp_path: Path
) -> None:
    emulator.faults.update({"caller_lacks": ["compute.subnetworks.useExternalIp"]})

    checks = _checks(emulator, tmp_path)
    assert checks["permissions"].status == "problem"
    assert "compute.subnetworks.useExternalIp" in checks["permissions"].summary

    emulator.clear_requests()
    # A VM without an external IP needs no access config: that permission is not asked.
    checks = _checks(emulator, tmp_path, internal_ip=True)
    assert checks["permissions"].status == "ok", checks
    assert "compute.subnetworks.useExternalIp" not in _asked_permissions(emulator)
    assert "private-access" in checks


def test_an_account_with_tpu_admin_cannot_delete_a_compute_instance(
    emulator: Emulator, tmp_path: Path
) -> None:
    """roles/tpu.admin deletes Cloud TPU nodes, not Compute instances: the same dedicated
    account is ok for the TPU API and a problem for Compute."""
    account = "tpu-vm@test-project.iam.gserviceaccount.com"
    emulator.faults.update({"tpu_admins": [account]})

    where = {"zone": "us-east5-a", "service_account": account}
    on_tpu = _checks(emulator, tmp_path, "v6e-4", **where)
    on_compute = _checks(emulator, tmp_path, "v6e-4", provider="compute", **where)

    assert on_tpu["vm-account"].status == "ok"
    assert on_compute["vm-account"].status == "problem"
    assert "compute.instances.delete" in on_compute["vm-account"].summary
    assert "roles/compute.instanceAdmin.v1" in (on_compute["vm-account"].fix or "")


def test_v6e_is_checked_on_the_provider_asked_for(emulator: Emulator, tmp_path: Path) -> None:
    on_tpu = _checks(emulator, tmp_path, "v6e-4", zone="us-east5-a")
    on_compute = _checks(emulator, tmp_path, "v6e-4", zone="us-east5-a", provider="compute")

    assert "tpu-api" in on_tpu
    assert "compute-api" not in on_tpu
    assert "machine-type" not in on_tpu  # the TPU API's zones come from the catalog
    assert "compute-api" in on_compute
    assert "tpu-api" not in on_compute
    assert "ct6e-standard-4t" in on_compute["machine-type"].summary


def test_without_a_zone_the_machine_type_is_unknown(emulator: Emulator, tmp_path: Path) -> None:
    checks = _checks(emulator, tmp_path, zone=None)

    assert checks["machine-type"].status == "unknown"
    assert "--zone" in (checks["machine-type"].fix or "")
    assert emulator.calls["get_machine_type"] == 0


def test_a_pair_the_catalog_does_not_serve_is_bad_input_before_any_request(
    emulator: Emulator, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="not served by the tpu-api provider"):
        _checks(emulator, tmp_path, provider="tpu-api")
    with pytest.raises(ConfigError, match="Unknown provider 'gke'"):
        _checks(emulator, tmp_path, None, provider="gke")
    assert emulator.requests() == []


def test_the_cli_prints_computes_checks_and_exits_3_on_a_problem(emulator: Emulator) -> None:
    emulator.faults.update({"disabled_services": ["compute.googleapis.com"]})

    done = tpulab(
        "doctor", "--api-endpoint", emulator.url, "--project", PROJECT,
        "--accelerator", "tpu7x-8", "--zone", ZONE, "--json",
    )  # fmt: skip

    document = DoctorEnvelope.model_validate_json(done.stdout)
    assert done.returncode == document.exit_status == 3, done.stderr
    by_name = {check.name: check for check in document.checks}
    assert by_name["compute-api"].status == "problem"
    assert "gcloud services enable compute.googleapis.com" in (by_name["compute-api"].fix or "")
    assert "tpu-api" not in by_name
    _created_nothing(emulator)
