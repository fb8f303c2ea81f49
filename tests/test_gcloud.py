"""The emulator works unchanged with gcloud: `gcloud compute tpus tpu-vm create,
describe, list, delete` against it, checking gcloud's own output (and that tpulab's
client sees what gcloud made)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import require_tool

from tpulab.models import NodeState

if TYPE_CHECKING:
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

pytestmark = pytest.mark.gcloud

ZONE = "us-central1-a"


def gcloud_env(emulator: Emulator, config_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
    env.update(
        CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=emulator.url + "/",
        CLOUDSDK_AUTH_DISABLE_CREDENTIALS="true",
        CLOUDSDK_CORE_PROJECT="test-project",
        CLOUDSDK_CONFIG=str(config_dir),
        CLOUDSDK_CORE_DISABLE_PROMPTS="1",
        CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
        CLOUDSDK_CORE_DISABLE_USAGE_REPORTING="true",
    )
    return env


def test_gcloud_create_describe_list_delete(emulator: Emulator, tmp_path: Path) -> None:
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    from emulator_fixtures import api_for

    env = gcloud_env(emulator, tmp_path / "gcloud-config")

    def gcloud(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["gcloud", "compute", "tpus", "tpu-vm", *args, f"--zone={ZONE}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    created = gcloud(
        "create",
        "gc-node",
        "--accelerator-type=v5litepod-4",
        "--version=v2-alpha-tpuv5-lite",
        "--labels=managed-by=tpulab,tpulab-run=gcloud-1",
        "--metadata=ssh-keys=tpulab:ssh-ed25519 AAAAC3Nza tpulab",
        "--spot",
    )
    assert created.returncode == 0, created.stderr
    assert "Created tpu [gc-node]" in created.stderr

    described = gcloud("describe", "gc-node", "--format=json")
    assert described.returncode == 0, described.stderr
    node = json.loads(described.stdout)
    assert node["name"].endswith("/locations/us-central1-a/nodes/gc-node")
    assert node["state"] == "READY"
    assert node["acceleratorType"] == "v5litepod-4"
    assert node["labels"] == {"managed-by": "tpulab", "tpulab-run": "gcloud-1"}
    assert node["schedulingConfig"]["spot"] is True

    # tpulab's client reads the node gcloud made.
    seen = api_for(emulator).get_node(ZONE, "gc-node")
    assert seen.state is NodeState.READY
    assert seen.spot
    assert seen.run_id == "gcloud-1"
    assert seen.metadata["ssh-keys"].startswith("tpulab:ssh-ed25519")

    listed = gcloud("list")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.strip().splitlines()
    assert header.split()[:3] == ["NAME", "ZONE", "ACCELERATOR_TYPE"]
    assert row.split()[0] == "gc-node"
    assert "V5LITE_POD" in row
    assert row.split()[-1] == "READY"

    refused = gcloud(
        "create", "bad-node", "--accelerator-type=v9-8", "--version=v2-alpha-tpuv5-lite"
    )
    assert refused.returncode != 0
    assert "INVALID_ARGUMENT" in refused.stderr
    assert "invalid AcceleratorType" in refused.stderr

    deleted = gcloud("delete", "gc-node", "--quiet")
    assert deleted.returncode == 0, deleted.stderr
    assert "Deleted tpu [gc-node]" in deleted.stderr
    assert emulator.node_names() == []

    missing = gcloud("describe", "gc-node")
    assert missing.returncode != 0
    assert "NOT_FOUND" in missing.stderr


def test_gcloud_update_patches_labels_and_metadata(emulator: Emulator, tmp_path: Path) -> None:
    """`gcloud compute tpus tpu-vm update` reads the node, then PATCHes it with an
    updateMask (the call `tpu-vm ssh` makes to add its key) and waits for the operation."""
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    from emulator_fixtures import api_for, node_request

    api = api_for(emulator)
    api.wait_operation(
        api.create_node(ZONE, "gc-upd", node_request(ssh_keys="tpulab:ssh-ed25519 AAAAC3Nza a")),
        timeout=20,
    )
    updated = subprocess.run(
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "update",
            "gc-upd",
            f"--zone={ZONE}",
            "--update-labels=added=yes",
            "--update-metadata=ssh-keys=gcloud:ssh-ed25519 AAAAC3NzaB gcloud",
        ],
        env=gcloud_env(emulator, tmp_path / "gcloud-config"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert updated.returncode == 0, updated.stderr
    node = api.get_node(ZONE, "gc-upd")
    assert node.labels["added"] == "yes"
    assert node.labels["tpulab-run"] == "run-1"  # read-modify-write kept the others
    assert node.metadata["ssh-keys"] == "gcloud:ssh-ed25519 AAAAC3NzaB gcloud"
    assert emulator.calls["update_node"] == 1
