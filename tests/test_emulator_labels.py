"""The emulator refuses labels as Google does (tpulab/emulator/labels.py), so a label
Google would refuse cannot pass offline; and tpulab's own check is never looser.

The refusals asserted word for word are the ones quoted from real services in
emulator/labels.py's docstring (a gcloud TPU create, Compute inserts)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from tpulab.cloud.api import QueuedResourceRequest
from tpulab.config import new_run_id
from tpulab.emulator.labels import compute_label_problem, tpu_label_problem
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


def _compute_insert(emulator: Emulator, labels: dict[str, str]) -> tuple[int, Any]:
    body = {
        "name": "vm-1",
        "machineType": f"zones/{ZONE}/machineTypes/ct6e-standard-4t",
        "disks": [{"boot": True, "initializeParams": {"sourceImage": "x/family/tpu-vm"}}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        "labels": labels,
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


# Labels Google takes, and labels it refuses (its rule: emulator/labels.py).
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
