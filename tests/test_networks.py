"""--network / --subnetwork: checked before anything is sent, carried into CreateNode's
networkConfig (and so into the dry-run plan), and refused by the emulator, as a project
refuses a network it does not have, before anything is created."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from run_rig import Rig

from tpulab.cloud import rest
from tpulab.cloud.tpu_v2 import node_request
from tpulab.config import TargetFlags, build_run_spec
from tpulab.config.project_file import load_project_file
from tpulab.errors import ConfigError, TpuLabError

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"network": "My_VPC"}, "Invalid --network 'My_VPC'"),
        ({"network": "projects/p/global/nets/x"}, "Invalid --network"),
        ({"subnetwork": "projects/p/regions/us-central1/networks/s"}, "Invalid --subnetwork"),
        ({"subnetwork": ""}, "Invalid --subnetwork"),
    ],
)
def test_a_bad_network_is_refused_before_anything_is_sent(
    flags: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        build_run_spec(target=TargetFlags(accelerator="v5litepod-4", emulate=True, **flags))


def test_the_network_goes_into_the_create_body_as_given() -> None:
    spec = build_run_spec(
        target=TargetFlags(
            accelerator="v5litepod-4",
            emulate=True,
            network="projects/my-project/global/networks/lab-vpc",
            subnetwork="lab-vpc",
        )
    )
    body = rest.node_body(node_request(spec, ssh_keys="u:k", startup_script=None))
    assert body["networkConfig"] == {
        "enableExternalIps": True,
        "network": "projects/my-project/global/networks/lab-vpc",
        "subnetwork": "lab-vpc",
    }
    plain = build_run_spec(target=TargetFlags(accelerator="v5litepod-4", emulate=True))
    body = rest.node_body(node_request(plain, ssh_keys="u:k", startup_script=None))
    assert body["networkConfig"] == {"enableExternalIps": True}  # the API's default


def test_the_workspace_file_names_the_network_and_a_flag_wins(tmp_path: Path) -> None:
    (tmp_path / "tpulab.toml").write_text('network = "lab-vpc"\nsubnetwork = "lab-vpc"\n')
    defaults = load_project_file(tmp_path)
    spec = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", emulate=True), defaults=defaults
    )
    assert (spec.network, spec.subnetwork) == ("lab-vpc", "lab-vpc")
    flagged = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", emulate=True, network="other"),
        defaults=defaults,
    )
    assert flagged.network == "other"
    (tmp_path / "tpulab.toml").write_text('network = "Bad Name"\n')
    with pytest.raises(ConfigError, match=r"Invalid network \(from tpulab.toml\)"):
        build_run_spec(
            target=TargetFlags(accelerator="v5litepod-4", emulate=True),
            defaults=load_project_file(tmp_path),
        )


def test_a_project_without_a_default_network_refuses_the_create_and_nothing_is_left(
    embedded_rig: Rig,
) -> None:
    embedded_rig.emulator.faults.no_default_network = True
    life, _recorder, error = embedded_rig.run(embedded_rig.spec())
    assert isinstance(error, TpuLabError), error
    assert "The referenced network resource cannot be found" in error.message
    assert "networks/default" in error.message
    assert not life.outcome.create_accepted
    assert embedded_rig.leftovers() == []


def test_a_run_in_the_projects_own_vpc_verifies_there(embedded_rig: Rig) -> None:
    faults = embedded_rig.emulator.faults
    faults.no_default_network = True
    faults.custom_networks = ["lab-vpc"]
    spec = dataclasses.replace(embedded_rig.spec(), network="lab-vpc", subnetwork="lab-vpc")
    life, _recorder, error = embedded_rig.run(spec)
    assert error is None, error
    assert life.outcome.verified
    assert embedded_rig.leftovers() == []
    creates = [
        r for r in embedded_rig.emulator.requests()
        if r["method"] == "POST" and r["path"].endswith("/nodes")
    ]  # fmt: skip
    assert creates[-1]["body"]["networkConfig"]["network"] == "lab-vpc"
    # A subnetwork of another network is refused before anything is created.
    wrong = dataclasses.replace(spec, subnetwork="default", run_id=spec.run_id + "-b")
    _life, _recorder, error = embedded_rig.run(wrong)
    assert isinstance(error, TpuLabError), error
    assert "subnetwork resource cannot be found" in error.message
    assert embedded_rig.leftovers() == []
