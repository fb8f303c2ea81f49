"""The classification table of tpulab.cloud.classify: one row per real answer of the API.

Each case quotes the message the real service sends (and where it was seen), goes in
through `error_for_status` exactly as `GoogleTpuApi` feeds it (HTTP error bodies and
long-running-operation errors alike), and names the tpulab error class it must become.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from tpulab import errors as E
from tpulab.cloud.classify import RPC_STATUS, RULES, classify, error_for_status
from tpulab.config import Resolved

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

# (status, real message, source, expected class)
REAL_ANSWERS: list[tuple[str, str, str, type[E.CloudError]]] = [
    (
        RPC_STATUS[8],
        'There is no more capacity in the zone "us-central1-a"; you can try in another '
        "zone where Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/"
        "regions) [EID: 0x1b1b3c4d]",
        "create operation error code 8 (DESIGN.md §5; SkyPilot's failover handler)",
        E.StockoutError,
    ),
    (
        RPC_STATUS[9],
        "Insufficient reserved capacity. Contact customer support to increase your "
        "reservation. [EID: 0x6a2d]",
        "create operation error code 9 (DESIGN.md §5; SkyPilot's failover handler)",
        E.StockoutError,
    ),
    (
        "RESOURCE_EXHAUSTED",
        "Quota limit 'TPUV5sLitepodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: "
        "4 in zone us-central1-a.",
        "429 on CreateNode (DESIGN.md §5)",
        E.QuotaError,
    ),
    (
        "RESOURCE_EXHAUSTED",
        "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per "
        "minute' of service 'tpu.googleapis.com'",
        "429 request-rate limit of Google APIs",
        E.TransientError,
    ),
    (
        "PERMISSION_DENIED",
        "Location europe-west1-b is not found or access is unauthorized.",
        "403 from the TPU API for a zone without TPU access (dstackai/gpuhunt#98)",
        E.LocationError,
    ),
    (
        "INVALID_ARGUMENT",
        "CloudTpu received an invalid AcceleratorType, got v5litepod-4 in us-east1-d",
        "400 on CreateNode (DESIGN.md §5)",
        E.InvalidArgumentError,
    ),
    (
        "ALREADY_EXISTS",
        "Resource 'projects/p/locations/us-central1-a/nodes/n' already exists",
        "409 on CreateNode (DESIGN.md §5)",
        E.AlreadyExistsError,
    ),
    (
        "PERMISSION_DENIED",
        "Permission 'tpu.nodes.get' denied on 'projects/p/locations/us-central1-b/nodes/ai'",
        "403 IAM denial (tensorflow/tpu#296)",
        E.PermissionDeniedError,
    ),
    (
        "PERMISSION_DENIED",
        "Request had insufficient authentication scopes.",
        "403 for a token without the cloud-platform scope (tensorflow/tpu#596)",
        E.PermissionDeniedError,
    ),
    (
        "UNAVAILABLE",
        "The service is currently unavailable.",
        "503 of Google APIs",
        E.TransientError,
    ),
    (
        "INTERNAL",
        "Internal error encountered.",
        "500 of Google APIs (google.rpc INTERNAL)",
        E.TransientError,
    ),
    (
        RPC_STATUS[10],
        "Operation aborted: the node was deleted during creation.",
        "create operation code 10 when DeleteNode reaches a CREATING node: the emulator's "
        "words (tpulab/emulator/state.py); no real message is on record here",
        E.NotFoundError,
    ),
]


@pytest.mark.parametrize(
    ("status", "message", "source", "kind"),
    REAL_ANSWERS,
    ids=[f"{row[0]}:{row[3].__name__}" for row in REAL_ANSWERS],
)
def test_each_real_answer_becomes_its_error_class(
    status: str, message: str, source: str, kind: type[E.CloudError]
) -> None:
    error = error_for_status(status, message, "create node n in us-central1-a")
    assert type(error) is kind, source
    assert error.api_message == message
    assert error.status == status
    assert error.hint


def test_every_rule_is_pinned_by_a_real_answer() -> None:
    matched = {id(classify(status, message)) for status, message, _, _ in REAL_ANSWERS}
    unpinned = [rule for rule in RULES if id(rule) not in matched and rule.phrases]
    assert unpinned == [], "a specific rule of the table has no real message quoted here"


def test_a_location_error_names_the_zone_and_what_to_check() -> None:
    error = error_for_status(
        "PERMISSION_DENIED",
        "Location us-south1-ai1b is not found or access is unauthorized.",
        "list nodes in us-south1-ai1b",
    )
    assert isinstance(error, E.LocationError)
    assert "us-south1-ai1b" in error.message
    assert "us-south1-ai1b" in (error.hint or "")
    assert "tpu.googleapis.com" in (error.hint or "")


def test_reserved_capacity_is_capacity_not_a_bad_accelerator_type() -> None:
    error = error_for_status(RPC_STATUS[9], "Insufficient reserved capacity.", "create node")
    assert isinstance(error, E.StockoutError)
    assert "accelerator type" not in (error.hint or "").lower()


def test_an_unknown_zone_is_refused_like_the_real_api_and_nothing_is_deleted(
    embedded_rig: Rig,
) -> None:
    spec = dataclasses.replace(embedded_rig.spec(), zone=Resolved("europe-west9-z", "--zone"))
    life, _, error = embedded_rig.run(spec)
    assert isinstance(error, E.LocationError)
    assert "europe-west9-z" in error.message
    # A synchronous refusal created nothing: no teardown, no delete, nothing left.
    assert life.outcome.teardown_status == "not-created"
    assert embedded_rig.emulator.calls["delete_node"] == 0
    assert embedded_rig.leftovers() == []
