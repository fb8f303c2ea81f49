"""`tpulab doctor` against a served emulator: all ok, then each negative answer.

The CLI runs as a subprocess against the emulator's URL (as against `tpulab emulator
serve`); each fault is the emulator's own (tpulab/emulator/faults.py), answered in the
real APIs' shapes (tpulab/emulator/project_apis.py). Every case also checks that doctor
created nothing: no create call, and only reads in the emulator's request log.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
from helpers import tpulab

from tpulab.app.doctor import DoctorEnvelope, run_preflight
from tpulab.cloud.preflight import refuse_on_problems
from tpulab.config import TargetFlags
from tpulab.emulator.iam import project_number
from tpulab.errors import CloudError, ConfigError

if TYPE_CHECKING:
    from pathlib import Path

    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"
COMPUTE_ACCOUNT = f"{project_number(PROJECT)}-compute@developer.gserviceaccount.com"
# The reads doctor may send (everything else would be a change).
_READS = re.compile(
    r"^/(v1/projects/[^/]+(:testIamPermissions|:getIamPolicy|/services/.+)|tokeninfo|compute/v1/.+)$"
)


def _doctor(emulator: Emulator, *extra: str) -> tuple[int, str]:
    done = tpulab("doctor", "--api-endpoint", emulator.url, "--project", PROJECT, *extra)
    return done.returncode, done.stdout + done.stderr


def _created_nothing(emulator: Emulator) -> None:
    assert emulator.calls["create_node"] == 0
    assert emulator.calls["create_queued_resource"] == 0
    for request in emulator.requests():
        assert request["method"] == "GET" or _READS.match(request["path"]), request
    assert emulator.node_names() == []


def _line(output: str, check: str) -> str:
    """The check's line and its fix line, as one string."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if re.match(rf"^\S+\s+{re.escape(check)}\s", line):
            follow = lines[index + 1] if index + 1 < len(lines) else ""
            return line + ("\n" + follow if "fix:" in follow else "")
    raise AssertionError(f"no {check} line in:\n{output}")


def test_a_ready_project_is_all_ok_and_exits_0(emulator: Emulator) -> None:
    status, output = _doctor(emulator)

    assert status == 0, output
    for check in ("credentials", "project", "tpu-api", "permissions", "vm-account", "network"):
        assert _line(output, check).startswith("ok"), output
    assert "owner@tpulab-emulator.example" in _line(output, "credentials")
    assert COMPUTE_ACCOUNT in _line(output, "vm-account")
    assert "ready for a run" in output
    _created_nothing(emulator)
    # Each API was asked (not assumed): one request per check.
    assert {name: emulator.calls[name] for name in ("get_service", "get_iam_policy")} == {
        "get_service": 1,
        "get_iam_policy": 1,
    }
    assert emulator.calls["test_iam_permissions"] == 1
    assert emulator.calls["get_network"] == emulator.calls["list_firewalls"] == 1


FAULTS: list[Any] = [
    pytest.param(
        {"disabled_services": ["tpu.googleapis.com"]},
        "tpu-api",
        "gcloud services enable tpu.googleapis.com --project test-project",
        3,
        id="api-disabled",
    ),
    pytest.param(
        {"caller_lacks": ["tpu.nodes.create"]},
        "permissions",
        "--member=user:owner@tpulab-emulator.example --role=roles/tpu.admin",
        3,
        id="caller-lacks-create",
    ),
    pytest.param(
        {"node_identity_cannot_delete": True},
        "vm-account",
        f"gcloud projects add-iam-policy-binding test-project "
        f"--member=serviceAccount:{COMPUTE_ACCOUNT} --role=roles/tpu.admin",
        3,
        id="vm-account-cannot-delete",
    ),
    pytest.param(
        {"no_default_network": True},
        "network",
        "gcloud compute networks create default --project test-project --subnet-mode auto",
        3,
        id="no-default-network",
    ),
    pytest.param(
        {"no_ssh_firewall": True},
        "network",
        "gcloud compute firewall-rules create tpulab-allow-ssh --project test-project "
        "--network default --direction INGRESS --allow tcp:22 --source-ranges 0.0.0.0/0",
        3,
        id="no-ssh-rule",
    ),
]


@pytest.mark.parametrize(("faults", "check", "fix", "exit_status"), FAULTS)
def test_each_negative_answer_is_a_problem_with_its_fix(
    emulator: Emulator, faults: dict[str, Any], check: str, fix: str, exit_status: int
) -> None:
    emulator.faults.update(faults)

    status, output = _doctor(emulator)

    assert status == exit_status, output
    line = _line(output, check)
    assert line.startswith("problem"), output
    assert fix in line.replace("\n", " ")
    others = [c for c in ("tpu-api", "permissions", "vm-account", "network") if c != check]
    for other in others:
        assert not _line(output, other).startswith("problem"), output
    assert "problem(s) to fix first" in output
    _created_nothing(emulator)


def test_a_policy_the_caller_cannot_read_is_unknown_not_a_problem(emulator: Emulator) -> None:
    emulator.faults.update({"caller_lacks": ["resourcemanager.projects.getIamPolicy"]})

    status, output = _doctor(emulator)

    assert status == 0, output
    line = _line(output, "vm-account")
    assert line.startswith("unknown"), output
    assert "gcloud projects get-iam-policy test-project" in line
    assert "problem" not in output.split("\n\n")[-1]


def test_json_is_the_envelope_with_every_check(emulator: Emulator) -> None:
    emulator.faults.update({"no_ssh_firewall": True})

    status, output = _doctor(emulator, "--json")

    document = DoctorEnvelope.model_validate_json(output)
    assert status == document.exit_status == 3
    assert not document.ok
    assert document.project == PROJECT
    assert document.account == "owner@tpulab-emulator.example"
    by_name = {check.name: check for check in document.checks}
    assert by_name["network"].status == "problem"
    assert by_name["tpu-api"].status == "ok"
    _created_nothing(emulator)


def test_a_dedicated_service_account_is_checked_with_actas(emulator: Emulator) -> None:
    account = "tpu-vm@test-project.iam.gserviceaccount.com"
    emulator.faults.update({"tpu_admins": [account]})

    status, output = _doctor(emulator, "--service-account", account)

    assert status == 0, output
    assert "all 6 permissions" in _line(output, "permissions")
    assert f"{account} holds roles/tpu.admin" in _line(output, "vm-account")
    asked = [r for r in emulator.requests() if r["path"].endswith(":testIamPermissions")]
    assert "iam.serviceAccounts.actAs" in asked[0]["body"]["permissions"]


def test_bad_input_is_exit_2_before_any_request(emulator: Emulator) -> None:
    status, output = _doctor(emulator, "--service-account", "not an email")

    assert status == 2, output
    assert "--service-account" in output
    assert emulator.requests() == []


def test_the_emulated_tpu_api_refuses_as_the_faults_say(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    """The faults are the project's, not only doctor's: the TPU API agrees with them."""
    from emulator_fixtures import node_request

    emulator.faults.update({"caller_lacks": ["tpu.nodes.create"]})
    with pytest.raises(CloudError) as denied:
        tpu_api.create_node(ZONE, "n1", node_request())
    assert "Permission 'tpu.nodes.create' denied" in denied.value.api_message
    emulator.faults.update({"caller_lacks": [], "disabled_services": ["tpu.googleapis.com"]})
    with pytest.raises(CloudError) as disabled:
        tpu_api.list_nodes(ZONE)
    assert "Cloud TPU API has not been used in project" in disabled.value.api_message
    assert emulator.node_names() == []


def test_run_preflight_is_the_cheap_subset_the_app_refuses_on(emulator: Emulator) -> None:
    ok = run_preflight(PROJECT, api_endpoint=emulator.url)
    assert [(c.name, c.status) for c in ok] == [("tpu-api", "ok"), ("permissions", "ok")]
    refuse_on_problems(ok)  # nothing to refuse

    emulator.faults.update({"disabled_services": ["tpu.googleapis.com"]})
    emulator.clear_requests()
    checks = run_preflight(PROJECT, api_endpoint=emulator.url)

    with pytest.raises(ConfigError, match="not enabled") as refused:
        refuse_on_problems(checks)
    assert "gcloud services enable tpu.googleapis.com" in (refused.value.hint or "")
    # Two requests, nothing else (a run needs no account name: no tokeninfo).
    paths = [r["path"] for r in emulator.requests()]
    assert paths == [
        f"/v1/projects/{PROJECT}/services/tpu.googleapis.com",
        f"/v1/projects/{PROJECT}:testIamPermissions",
    ]


def test_a_custom_network_is_checked_by_name_and_needs_its_own_ssh_rule(
    emulator: Emulator,
) -> None:
    # A VPC made with `gcloud compute networks create` has no firewall rules at all.
    emulator.faults.update({"no_default_network": True, "custom_networks": ["lab-vpc"]})

    status, output = _doctor(emulator, "--network", "lab-vpc")

    assert status == 3, output
    line = _line(output, "network")
    assert line.startswith("problem"), output
    assert "--network lab-vpc --direction INGRESS --allow tcp:22" in line.replace("\n", " ")
    status, output = _doctor(emulator, "--network", "other-vpc")
    assert "has no `other-vpc` network" in _line(output, "network").replace("\n", " ")
    status, output = _doctor(emulator, "--network", "Bad_Name")
    assert status == 2, output
    assert "Invalid --network 'Bad_Name'" in output
    _created_nothing(emulator)


@pytest.mark.parametrize(
    ("faults", "words"),
    [
        (
            {"disabled_services": ["tpu.googleapis.com"]},
            "gcloud services enable tpu.googleapis.com",
        ),
        ({"caller_lacks": ["tpu.nodes.create"]}, "tpu.nodes.create"),
    ],
)
def test_run_and_up_refuse_a_definite_problem_before_the_create(
    emulator: Emulator, faults: dict[str, Any], words: str
) -> None:
    """`run` asks the cheap preflight before its create: a project that cannot run gets
    exit 2 and its fix, not a node that then fails (nothing is created, no journal row)."""
    emulator.faults.update(faults)
    for command in ("run", "up"):
        done = tpulab(
            command, "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
            "--project", PROJECT, "--zone", ZONE,
        )  # fmt: skip
        said = done.stdout + done.stderr
        assert done.returncode == 2, said
        assert words in said.replace("\n", " ")
        assert "tpulab doctor" in said
    _created_nothing(emulator)


def test_a_default_account_that_cannot_delete_gets_the_dedicated_account_recipe(
    emulator: Emulator,
) -> None:
    emulator.faults.update({"node_identity_cannot_delete": True})

    _status, output = _doctor(emulator)

    line = " ".join(_line(output, "vm-account").split())
    account = "tpulab-vm@test-project.iam.gserviceaccount.com"
    assert "gcloud iam service-accounts create tpulab-vm --project test-project" in line
    assert f"--member=serviceAccount:{account} --role=roles/tpu.admin" in line
    assert f"--service-account {account} (or [tool.tpulab] service_account)" in line


def test_the_workspace_file_names_the_vm_account_and_a_flag_wins(tmp_path: Path) -> None:
    from tpulab.config import build_run_spec
    from tpulab.config.project_file import load_project_file

    account = "tpulab-vm@test-project.iam.gserviceaccount.com"
    (tmp_path / "tpulab.toml").write_text(f'service_account = "{account}"\n')
    defaults = load_project_file(tmp_path)
    spec = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", emulate=True), defaults=defaults
    )
    assert spec.service_account == account
    other = "other@test-project.iam.gserviceaccount.com"
    flagged = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", emulate=True, service_account=other),
        defaults=defaults,
    )
    assert flagged.service_account == other
    (tmp_path / "tpulab.toml").write_text('service_account = "not an email"\n')
    with pytest.raises(ConfigError, match=r"not a service account e-mail address \(from"):
        build_run_spec(
            target=TargetFlags(accelerator="v5litepod-4", emulate=True),
            defaults=load_project_file(tmp_path),
        )


def test_doctor_checks_the_account_and_network_the_workspace_file_names(
    emulator: Emulator, tmp_path: Path
) -> None:
    from tpulab.config.doctor import doctor_inputs

    account = "tpulab-vm@test-project.iam.gserviceaccount.com"
    (tmp_path / "tpulab.toml").write_text(
        f'service_account = "{account}"\nnetwork = "projects/test-project/global/networks/v"\n'
    )
    inputs = doctor_inputs(
        project=PROJECT,
        zone=None,
        accelerator=None,
        service_account=None,
        emulate=False,
        api_endpoint=emulator.url,
        cwd=tmp_path,
    )
    assert (inputs.service_account, inputs.network) == (account, "v")
    flagged = doctor_inputs(
        project=PROJECT,
        zone=None,
        accelerator=None,
        service_account="x@test-project.iam.gserviceaccount.com",
        emulate=False,
        api_endpoint=emulator.url,
        cwd=tmp_path,
        network="w",
    )
    assert (flagged.service_account, flagged.network) == (
        "x@test-project.iam.gserviceaccount.com",
        "w",
    )
