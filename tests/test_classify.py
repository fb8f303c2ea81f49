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
from tpulab.cloud.classify import RPC_STATUS, RULES, Scope, classify, error_for_status, scope_of
from tpulab.config import Resolved

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

# SkyPilot's failover handler, where most of these messages are quoted from real answers:
# sky/backends/cloud_vm_ray_backend.py, FailoverCloudErrorHandlerV2._gcp_handler (in
# newer trees the class moved to a "Provider failure parsing and resource block-list
# policy" module); the branches named below are `elif code in [3, 8, 9]`, `elif code ==
# 'type.googleapis.com/google.rpc.QuotaFailure'` and `elif 'is not found or access is
# unauthorized' in message`; the invalid-type text is from FailoverCloudErrorHandlerV1's
# gcloud-output branch `if 'CloudTpu received an invalid AcceleratorType' in stderr`.
SKY = "SkyPilot sky/backends/cloud_vm_ray_backend.py FailoverCloudErrorHandlerV2._gcp_handler"

# (status, real message, source, expected class, failover scope)
REAL_ANSWERS: list[tuple[str, str, str, type[E.CloudError], Scope]] = [
    (
        "PERMISSION_DENIED",
        "Required 'compute.instances.create' permission for "
        "'projects/qwiklabs-gcp-04-631da58f3d4a/zones/us-central1-a/instances/lab-2'",
        "Compute Engine's 403 to `gcloud compute instances create` (a Qwiklabs transcript "
        "quoted in a public repository's notes), the Compute provider's create",
        E.PermissionDeniedError,
        "fatal",
    ),
    (
        "INVALID_ARGUMENT",
        "The referenced network resource cannot be found: projects/p/global/networks/default.",
        "Compute's 400 for a missing network (GoogleCloudPlatform/magic-modules #18826 "
        "retries on it); the TPU API's own wording is not on record here",
        E.InvalidArgumentError,
        "fatal",
    ),
    (
        "INVALID_ARGUMENT",
        'Project "xxxx-xxx-xxxxxx" has no network named "default".',
        "GKE's 400 badRequest (googlecloudrobotics/core #339)",
        E.InvalidArgumentError,
        "fatal",
    ),
    (
        RPC_STATUS[8],
        'There is no more capacity in the zone "europe-west4-a"; you can try in another '
        "zone where Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/"
        "regions) [EID: 0x1bc8f9d790be9142]",
        f"create operation error code 8 ({SKY}, `code in [3, 8, 9]`)",
        E.StockoutError,
        "zone",
    ),
    (
        RPC_STATUS[9],
        "Insufficient reserved capacity. Contact customer support to increase your "
        "reservation. [EID: 0x2f8bc266e74261a]",
        f"create operation error code 9 ({SKY}, `code in [3, 8, 9]`)",
        E.StockoutError,
        "zone",
    ),
    (
        RPC_STATUS[3],
        "Cloud TPU received a bad request. update is not supported while in state "
        "PREEMPTED [EID: 0x73013519f5b7feb2]",
        f"create operation error code 3, preempted during create ({SKY}, `code in [3, 8, 9]`)",
        E.PreemptedError,
        "zone",
    ),
    (
        "RESOURCE_EXHAUSTED",
        "Quota 'TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. Limit 32 in "
        "region europe-west4",
        f"QuotaFailure 'in region' ({SKY}, `google.rpc.QuotaFailure` branch)",
        E.QuotaError,
        "region",
    ),
    (
        "RESOURCE_EXHAUSTED",
        "Quota 'TPUV2sPreemptiblePodPerProjectPerZoneForTPUAPI' exhausted. Limit 32 in "
        "zone europe-west4-a",
        f"QuotaFailure 'in zone' ({SKY}, `google.rpc.QuotaFailure` branch)",
        E.QuotaError,
        "zone",
    ),
    (
        "RESOURCE_EXHAUSTED",
        "Quota limit 'TPUV5sLitepodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: "
        "4 in zone us-central1-a.",
        "429 on CreateNode (docs/architecture.md §5)",
        E.QuotaError,
        "zone",
    ),
    (
        "RESOURCE_EXHAUSTED",
        "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per "
        "minute' of service 'tpu.googleapis.com'",
        "429 request-rate limit of Google APIs",
        E.TransientError,
        "zone",
    ),
    (
        "PERMISSION_DENIED",
        "Location us-east1-d is not found or access is unauthorized.",
        f"403 for a zone without TPU access ({SKY}, `is not found or access is "
        "unauthorized` branch; also dstackai/gpuhunt#98)",
        E.LocationError,
        "zone",
    ),
    (
        "INVALID_ARGUMENT",
        'CloudTpu received an invalid AcceleratorType, "v3-8" for zone "us-central1-c". '
        'Valid values are "v2-8, ".',
        "400 on CreateNode in a zone without the type (SkyPilot "
        "FailoverCloudErrorHandlerV1, `CloudTpu received an invalid AcceleratorType`)",
        E.InvalidArgumentError,
        "zone",
    ),
    (
        "INVALID_ARGUMENT",
        "CloudTpu received an invalid AcceleratorType, got v5litepod-4 in us-east1-d",
        "400 on CreateNode (docs/architecture.md §5)",
        E.InvalidArgumentError,
        "zone",
    ),
    (
        "ALREADY_EXISTS",
        "Resource 'projects/p/locations/us-central1-a/nodes/n' already exists",
        "409 on CreateNode (docs/architecture.md §5)",
        E.AlreadyExistsError,
        "fatal",
    ),
    (
        "PERMISSION_DENIED",
        "Permission 'tpu.nodes.get' denied on 'projects/p/locations/us-central1-b/nodes/ai'",
        "403 IAM denial (tensorflow/tpu#296)",
        E.PermissionDeniedError,
        "fatal",
    ),
    (
        "PERMISSION_DENIED",
        "Request had insufficient authentication scopes.",
        "403 for a token without the cloud-platform scope (tensorflow/tpu#596)",
        E.PermissionDeniedError,
        "fatal",
    ),
    (
        "UNAVAILABLE",
        "The service is currently unavailable.",
        "503 of Google APIs",
        E.TransientError,
        "zone",
    ),
    (
        "INTERNAL",
        "Internal error encountered.",
        "500 of Google APIs (google.rpc INTERNAL)",
        E.TransientError,
        "zone",
    ),
    (
        RPC_STATUS[10],
        "Operation aborted: the node was deleted during creation.",
        "create operation code 10 when DeleteNode reaches a CREATING node: the emulator's "
        "words (tpulab/emulator/state.py); no real message is on record here",
        E.NotFoundError,
        "fatal",
    ),
    (
        RPC_STATUS[4],
        "The queued resource could not be provisioned before its 'valid until' start "
        "timing constraint expired (2026-01-01T00:00:00Z): no capacity for v5litepod-4 in "
        "zone us-central1-a in time.",
        "a queued resource's failedData.error when its window closed: the v2 discovery "
        "document's words for FAILED ('the valid until start timing constraint expired'); "
        "the code (4) and the rest are the emulator's (tpulab/emulator/queued.py)",
        E.QueueExpiredError,  # a StockoutError: a capacity failure, exit 3
        "zone",
    ),
]


@pytest.mark.parametrize(
    ("status", "message", "source", "kind", "scope"),
    REAL_ANSWERS,
    ids=[f"{row[0]}:{row[3].__name__}:{row[4]}" for row in REAL_ANSWERS],
)
def test_each_real_answer_becomes_its_error_class_and_scope(
    status: str, message: str, source: str, kind: type[E.CloudError], scope: Scope
) -> None:
    error = error_for_status(status, message, "create node n in us-central1-a")
    assert type(error) is kind, source
    assert error.api_message == message
    assert error.status == status
    assert error.hint
    assert scope_of(error) == scope, source


def test_every_rule_is_pinned_by_a_real_answer() -> None:
    matched = {id(classify(status, message)) for status, message, *_ in REAL_ANSWERS}
    unpinned = [rule for rule in RULES if id(rule) not in matched and rule.phrases]
    assert unpinned == [], "a specific rule of the table has no real message quoted here"


def test_errors_without_an_api_status_are_scoped_by_their_class() -> None:
    # A poll that saw PREEMPTED, a wait that ran out, an unparsed status: SkyPilot blocks
    # "unparsed" errors by zone; only classes that mean "everywhere" are fatal.
    assert scope_of(E.PreemptedError("preempted", status="PREEMPTED")) == "zone"
    assert scope_of(E.DeadlineError("gave up")) == "zone"
    assert scope_of(E.CloudError("odd", status="DATA_LOSS")) == "zone"
    assert scope_of(E.PermissionDeniedError("no", status="")) == "fatal"
    assert scope_of(E.QuotaError("quota", status="")) == "region"


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
