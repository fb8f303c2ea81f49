"""The emulator refuses labels and metadata as Google does (tpulab/emulator/
resource_rules.py), so what Google would refuse cannot pass offline; tpulab's own label
check is never looser, and what tpulab sends as metadata fits.

The refusals asserted word for word are the ones quoted from real services in
emulator/resource_rules.py's docstring (a gcloud TPU create, Compute inserts)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tpulab.cloud.api import QueuedResourceRequest
from tpulab.config import new_run_id
from tpulab.emulator.resource_rules import (
    MAX_METADATA_VALUE,
    compute_label_problem,
    metadata_problem,
    tpu_label_problem,
)
from tpulab.errors import ConfigError, InvalidArgumentError
from tpulab.models import NodeRequest, check_label, tpulab_labels

if TYPE_CHECKING:
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

ZONE = "us-central1-a"
# What gcloud printed for a real TPU create (GoogleCloudPlatform/ml-testing-accelerators#461).
DOTTED = {"test-name": "pt-r1.9-resnet50-mp-func-v3-32-1vm"}
DOTTED_REFUSAL = (
    'resource labels are invalid: value "pt-r1.9-resnet50-mp-func-v3-32-1vm" contains '
    "invalid character '.' at index 5 for key \"test-name\""
)


def _node(labels: dict[str, str]) -> NodeRequest:
    return NodeRequest(
        accelerator_type="v5litepod-4", runtime_version="v2-alpha-tpuv5-lite", labels=labels
    )


def test_a_tpu_create_with_a_bad_label_is_refused_in_the_apis_words_and_makes_nothing(
    emulator: Emulator,
) -> None:
    from emulator_fixtures import api_for

    api = api_for(emulator)
    with pytest.raises(InvalidArgumentError) as refused:
        api.create_node(ZONE, "dotted", _node(DOTTED))
    assert refused.value.api_message == DOTTED_REFUSAL
    with pytest.raises(InvalidArgumentError) as upper:
        api.create_node(ZONE, "upper", _node({"owner": "Alice"}))
    assert "contains invalid character 'A' at index 0" in str(upper.value.api_message)
    assert api.list_nodes(ZONE) == []

    # tpulab's own labels (a run id, a kind, an owner) are taken.
    api.create_node(ZONE, "ours", _node(tpulab_labels(new_run_id(), kind="run", owner="a1b2")))
    assert [node.name for node in api.list_nodes(ZONE)] == ["ours"]


def test_a_queued_resource_with_a_bad_node_label_is_refused_and_makes_nothing(
    emulator: Emulator,
) -> None:
    from emulator_fixtures import api_for

    api = api_for(emulator)
    request = QueuedResourceRequest(node_id="qr-node", node=_node(DOTTED))
    with pytest.raises(InvalidArgumentError) as refused:
        api.create_queued_resource(ZONE, "qr", request)
    assert refused.value.api_message == DOTTED_REFUSAL
    assert api.list_queued_resources(ZONE) == []
    assert api.list_nodes(ZONE) == []


def _compute_insert(
    emulator: Emulator, labels: dict[str, str], metadata: dict[str, str] | None = None
) -> tuple[int, Any]:
    body: dict[str, Any] = {
        "name": "vm-1",
        "machineType": f"zones/{ZONE}/machineTypes/ct6e-standard-4t",
        "disks": [{"boot": True, "initializeParams": {"sourceImage": "x/family/tpu-vm"}}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        "labels": labels,
        "metadata": {"items": [{"key": k, "value": v} for k, v in (metadata or {}).items()]},
    }
    request = urllib.request.Request(
        f"{emulator.url}/compute/v1/projects/p/zones/{ZONE}/instances",
        data=json.dumps(body).encode(),
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read())


def test_a_compute_insert_with_a_bad_label_is_refused_in_computes_words(
    emulator: Emulator,
) -> None:
    status, answer = _compute_insert(emulator, {"my_vm_name": "test-by-Ahtasham"})
    assert status == 400
    # googleapis/google-cloud-node-core#276
    assert answer["error"]["message"] == (
        "Invalid value for field 'resource.labels': ''. Label value 'test-by-Ahtasham' "
        "violates format constraints. The value can only contain lowercase letters, numeric "
        "characters, underscores and dashes. The value can be at most 63 characters long. "
        "International characters are allowed."
    )
    assert answer["error"]["errors"][0]["reason"] == "invalid"
    status, answer = _compute_insert(emulator, {"KubernetesCluster": "frb-kubo"})
    assert status == 400
    # cloudfoundry-incubator/kubo-deployment#159
    assert answer["error"]["message"].startswith(
        "Invalid value for field 'resource.labels': ''. Label key 'KubernetesCluster' "
        "violates format constraints. The key must start with a lowercase character,"
    )
    assert emulator.instance_names() == []
    status, _ = _compute_insert(emulator, tpulab_labels(new_run_id(), kind="session"))
    assert status == 200
    assert emulator.instance_names() == ["vm-1"]


# Labels Google takes, and labels it refuses (its rule: emulator/resource_rules.py).
TAKEN = [
    ("k", ""),
    ("a" * 63, "b" * 63),
    ("run_id-2", "20261206t101500-abc123"),
    ("owner", "über"),  # international characters are allowed
]
REFUSED = [
    ("k", "A"),
    ("k", "a.b"),
    ("k", "a b"),
    ("k", "x" * 64),
    ("a" * 64, "v"),
    ("", "v"),
    ("1abc", "v"),
    ("-abc", "v"),
    ("Key", "v"),
]


@pytest.mark.parametrize(("key", "value"), TAKEN)
def test_labels_google_takes_are_taken_by_both_apis(key: str, value: str) -> None:
    assert tpu_label_problem({key: value}) is None
    assert compute_label_problem({key: value}) is None


@pytest.mark.parametrize(("key", "value"), REFUSED)
def test_labels_google_refuses_are_refused_by_both_apis_and_by_tpulab_first(
    key: str, value: str
) -> None:
    assert tpu_label_problem({key: value}) is not None
    assert compute_label_problem({key: value}) is not None
    # tpulab refuses it before any call: nothing it sends can meet this refusal online.
    with pytest.raises(ConfigError):
        check_label(key, value)


def test_sixty_five_labels_are_too_many() -> None:
    labels = {f"k{i}": "v" for i in range(65)}
    assert tpu_label_problem(labels) is not None
    assert compute_label_problem(labels) is not None
    assert tpu_label_problem(dict(list(labels.items())[:64])) is None


def test_metadata_keys_values_and_total_are_held_to_computes_limits() -> None:
    assert metadata_problem({"startup-script": "x" * MAX_METADATA_VALUE, "ssh-keys": "k"}) is None
    too_big = metadata_problem({"startup-script": "x" * (MAX_METADATA_VALUE + 1)})
    assert too_big is not None
    assert "'startup-script' is 262145 bytes" in too_big
    # Bytes, not characters: 131,073 two-byte characters are 262,146 bytes.
    assert metadata_problem({"k": "é" * (MAX_METADATA_VALUE // 2 + 1)}) is not None
    assert metadata_problem({f"k{i}": "x" * 200_000 for i in range(3)}) is not None
    for key in ("a.b", "", "a b", "k" * 128):
        assert metadata_problem({key: "v"}) is not None, key
    assert metadata_problem({"A_b-9": "v", "k" * 127: "v"}) is None


def test_a_create_with_oversized_metadata_is_refused_and_makes_nothing(
    emulator: Emulator,
) -> None:
    from emulator_fixtures import api_for

    api = api_for(emulator)
    big = NodeRequest(
        accelerator_type="v5litepod-4",
        runtime_version="v2-alpha-tpuv5-lite",
        metadata={"startup-script": "#" * (MAX_METADATA_VALUE + 1)},
    )
    with pytest.raises(InvalidArgumentError) as refused:
        api.create_node(ZONE, "big", big)
    assert "'startup-script' is 262145 bytes" in str(refused.value.api_message)
    assert api.list_nodes(ZONE) == []
    status, answer = _compute_insert(emulator, {}, metadata={"bad key": "v"})
    assert status == 400
    assert answer["error"]["message"].startswith(
        "Invalid value for field 'resource.metadata': Metadata key 'bad key' is invalid"
    )
    assert emulator.instance_names() == []


def test_what_a_run_sends_as_metadata_fits_googles_limits(tmp_path: Path) -> None:
    """The node request a real run builds (its startup-script carries the watchdog): the
    dry run's plan is that request, so its metadata is what Google would be sent."""
    result = subprocess.run(
        [sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-16",
         "--zone", "us-central1-a", "--project", "p-123456", "--dry-run", "--json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    bodies = [
        step["body"]
        for step in _walk(json.loads(result.stdout))
        if isinstance(step.get("body"), dict) and "metadata" in step["body"]
    ]
    assert bodies, "the plan sends no node with metadata"
    for body in bodies:
        metadata = body["metadata"]
        assert len(metadata["startup-script"]) > 10_000  # the watchdog is in it
        assert metadata_problem(metadata) is None


def _walk(value: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        found.append(value)
        for item in value.values():
            found += _walk(item)
    elif isinstance(value, list):
        for item in value:
            found += _walk(item)
    return found
