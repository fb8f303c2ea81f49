"""Compute Engine v1's JSON for an emulated instance (instances.py serves it): the
`Instance`, `Operation` and `Metadata` messages, `error.errors[]` refusals and failed
operations' errors, list pages and list filters, as gcloud's generated Compute v1 client
(googlecloudsdk/generated_clients/apis/compute/v1) reads them. Shapes only: what the
API does with a request is instances.py's.
"""

from __future__ import annotations

import base64
import fnmatch
import re
import zlib
from collections.abc import Callable
from typing import Any

from tpulab.emulator.wire import rfc3339
from tpulab.emulator.workers import worker_address

__all__ = [
    "BASE",
    "ComputeError",
    "compute_id",
    "fingerprint",
    "instance_json",
    "instance_path",
    "instance_status",
    "list_filter",
    "list_page",
    "metadata_json",
    "operation_json",
    "quota_error",
    "stockout_error",
]

Record = dict[str, Any]

BASE = "https://www.googleapis.com/compute/v1/"
_MAX_RESULTS = 500  # Compute's default and largest page
_STATUS_OF_STATE = {
    "READY": "RUNNING",
    "DELETING": "STOPPING",
    "PREEMPTED": "TERMINATED",
    "TERMINATED": "TERMINATED",
}


class ComputeError(Exception):
    """An error Compute answers with, in its `{"error": {code, message, errors[]}}` shape."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        domain: str = "global",
        extra: Record | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.domain = domain
        # Fields beside code/message/errors (status, details) some refusals carry.
        self.extra = extra or {}

    def body(self) -> Record:
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}],
                **self.extra,
            }
        }


def instance_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/zones/{zone}/instances/{name}"


def metadata_json(record: Record) -> Record:
    items = [{"key": k, "value": v} for k, v in sorted(record["metadata"].items())]
    # Base64 bytes that change with the items, as Compute's optimistic-lock value.
    return {"kind": "compute#metadata", "fingerprint": fingerprint(repr(items)), "items": items}


def instance_status(record: Record, now: float) -> str:
    """Compute's status: PROVISIONING for the first half of the create, then STAGING,
    RUNNING when the TPU API would say READY, STOPPING while deleted, and TERMINATED
    once a preempted spot VM is reported stopped."""
    state = record["state"]
    if state == "CREATING":
        halfway = record["create_time"] + (record["ready_at"] - record["create_time"]) / 2
        return "PROVISIONING" if now < halfway else "STAGING"
    return _STATUS_OF_STATE.get(state, "RUNNING")


def instance_json(record: Record, now: float) -> Record:
    """An instance record as Compute v1's `Instance` JSON."""
    project, zone, name = record["project"], record["zone"], record["name"]
    zone_link = f"{BASE}projects/{project}/zones/{zone}"
    region = zone.rsplit("-", 1)[0]
    address = worker_address(record, 0)
    interface: Record = {
        "kind": "compute#networkInterface",
        "name": "nic0",
        "network": f"{BASE}projects/{project}/global/networks/{record['network']}",
        "subnetwork": f"{BASE}projects/{project}/regions/{region}/subnetworks/"
        f"{record['subnetwork'] or record['network']}",
        "networkIP": address,
        "stackType": "IPV4_ONLY",
        "fingerprint": fingerprint(address),
    }
    if record["external_ips"]:
        # An emulated VM is reached at its one (loopback) address either way.
        interface["accessConfigs"] = [
            {
                "kind": "compute#accessConfig",
                "type": "ONE_TO_ONE_NAT",
                "name": "external-nat",
                "natIP": address,
                "networkTier": "PREMIUM",
            }
        ]
    scheduling: Record = {
        "onHostMaintenance": "TERMINATE",  # TPU VMs cannot live-migrate
        "automaticRestart": not record["spot"],
        "preemptible": record["preemptible"],
        "provisioningModel": "SPOT" if record["spot"] else "STANDARD",
    }
    if record.get("termination_action"):
        scheduling["instanceTerminationAction"] = record["termination_action"]
    account = record.get("service_account") or {}
    body: Record = {
        "kind": "compute#instance",
        "id": record["id"],
        "creationTimestamp": rfc3339(record["create_time"]),
        "name": name,
        "description": record["description"],
        "tags": {"fingerprint": fingerprint("")},
        "machineType": f"{zone_link}/machineTypes/{record['machine_type']}",
        "status": instance_status(record, now),
        "zone": zone_link,
        "canIpForward": False,
        "networkInterfaces": [interface],
        "disks": [
            {
                "kind": "compute#attachedDisk",
                "type": "PERSISTENT",
                "mode": "READ_WRITE",
                "source": f"{zone_link}/disks/{name}",
                "deviceName": "persistent-disk-0",
                "index": 0,
                "boot": True,
                "autoDelete": True,
                "interface": "SCSI",
            }
        ],
        "metadata": metadata_json(record),
        "serviceAccounts": [
            {
                "email": account.get("email") or "default",
                "scopes": list(account.get("scopes") or []),
            }
        ],
        "selfLink": f"{BASE}{instance_path(project, zone, name)}",
        "scheduling": scheduling,
        "labels": dict(record["labels"]),
        "labelFingerprint": fingerprint(repr(sorted(record["labels"].items()))),
        "startRestricted": False,
        "deletionProtection": False,
        "fingerprint": fingerprint(record["id"]),
    }
    if record.get("ready_time") is not None:
        body["lastStartTimestamp"] = rfc3339(record["ready_time"])
    if body["status"] == "TERMINATED" and record.get("vm_stopped_at") is not None:
        body["lastStopTimestamp"] = rfc3339(record["vm_stopped_at"])
    return body


def operation_json(operation: Record, now: float) -> Record:
    """A zonal operation as Compute v1's `Operation` JSON: PENDING, RUNNING, then DONE
    with `error.errors[]` (and `httpErrorStatusCode`) when it failed."""
    project, zone, name = operation["project"], operation["zone"], operation["name"]
    done_at = operation["done_at"]
    done = done_at is not None and now >= done_at
    body: Record = {
        "kind": "compute#operation",
        "id": operation["id"],
        "name": name,
        "zone": f"{BASE}projects/{project}/zones/{zone}",
        "operationType": operation["verb"],
        "targetLink": f"{BASE}{instance_path(project, zone, operation['node'])}",
        "targetId": operation["id"],
        "status": "DONE" if done else "RUNNING",
        "user": "owner@tpulab-emulator.example",
        "progress": 100 if done else 0,
        "insertTime": rfc3339(operation["create_time"]),
        "startTime": rfc3339(operation["create_time"]),
        "selfLink": f"{BASE}projects/{project}/zones/{zone}/operations/{name}",
    }
    if done:
        body["endTime"] = rfc3339(done_at)
        if operation["error"]:
            error = operation["error"]
            body["error"] = {"errors": list(error["errors"])}
            body["httpErrorStatusCode"] = error.get("http", 400)
            body["httpErrorMessage"] = error.get("http_message", "BAD REQUEST")
    return body


def stockout_error(project: str, zone: str, machine_type: str) -> Record:
    # The words of cloud.google.com/compute/docs/resource-error; the errorDetails as a
    # real insert's operation carried them (GoogleCloudPlatform/ai-on-gke#849).
    return {
        "errors": [
            {
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": f"The zone 'projects/{project}/zones/{zone}' does not have enough "
                "resources available to fulfill the request.  Try a different zone, or try "
                "again later.",
                "errorDetails": [
                    {
                        "errorInfo": {
                            "reason": "resource_availability",
                            "domain": "compute.googleapis.com",
                            "metadatas": {
                                "zone": zone,
                                "vmType": machine_type,
                                "attachment": "",
                                "zonesAvailable": "",
                            },
                        }
                    },
                    {
                        "help": {
                            "links": [
                                {
                                    "description": "Troubleshooting documentation",
                                    "url": "https://cloud.google.com/compute/docs/resource-error",
                                }
                            ]
                        }
                    },
                ],
            }
        ],
        "http": 503,
        "http_message": "SERVICE UNAVAILABLE",
    }


def quota_error(zone: str, machine_type: str) -> Record:
    # Compute's words: "Quota 'C2_CPUS' exceeded.  Limit: 50.0 in region us-east1."
    # (scylladb/scylla-cluster-tests#3649). The TPU metric's name is not on record: the
    # emulator names it after the machine type's family.
    region = zone.rsplit("-", 1)[0]
    metric = machine_type.split("-", 1)[0].upper() + "_TPUS"
    return {
        "errors": [
            {
                "code": "QUOTA_EXCEEDED",
                "message": f"Quota '{metric}' exceeded.  Limit: 0.0 in region {region}.",
                "errorDetails": [
                    {
                        "quotaInfo": {
                            "metricName": f"compute.googleapis.com/{metric.lower()}",
                            "limitName": f"{metric}-per-project-region",
                            "dimensions": {"region": region},
                            "limit": 0,
                        }
                    }
                ],
            }
        ],
        "http": 403,
        "http_message": "FORBIDDEN",
    }


def list_page(items: list[Record], max_results: str, token: str) -> tuple[list[Record], str]:
    size = _MAX_RESULTS
    if max_results:
        if not max_results.isdigit() or not 0 <= int(max_results) <= _MAX_RESULTS:
            raise ComputeError(
                400,
                "invalid",
                f"Invalid value for field 'maxResults': '{max_results}'. Must be less than or "
                f"equal to {_MAX_RESULTS}",
            )
        size = int(max_results) or _MAX_RESULTS
    start = 0
    if token:
        if not token.isdigit() or int(token) > len(items):
            raise ComputeError(400, "invalid", f"Invalid value for field 'pageToken': '{token}'.")
        start = int(token)
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")


# One comparison of Compute's list filter: `labels.KEY = VALUE`, `name != VALUE`,
# `status eq RE2` ... ("=" and "!=" compare the whole value, "*" a wildcard; "eq" and
# "ne" take a regular expression that must match all of it), optionally in parentheses;
# several, separated by spaces or AND, must all hold.
_TERM = re.compile(
    r"\(?\s*(?P<field>labels\.[a-z0-9_-]+|name|status)\s*"
    r"(?P<op>!=|=|\beq\b|\bne\b)\s*"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s()]+)\s*\)?"
)


def list_filter(text: str) -> Callable[[Record, float], bool]:
    terms: list[tuple[str, str, str]] = []
    rest = text.strip()
    while rest:
        match = _TERM.match(rest)
        if match is None:
            raise ComputeError(
                400,
                "invalid",
                f"Invalid value for field 'filter': '{text}'. Invalid list filter expression.",
            )
        value = match["value"]
        if value[:1] in {'"', "'"}:
            value = value[1:-1]
        terms.append((match["field"], match["op"], value))
        rest = rest[match.end() :].strip()
        if rest.upper().startswith("AND "):
            rest = rest[4:].strip()

    def field_value(record: Record, field: str, now: float) -> str | None:
        if field.startswith("labels."):
            found = record["labels"].get(field.split(".", 1)[1])
            return None if found is None else str(found)
        if field == "status":
            return instance_status(record, now)
        return str(record["name"])

    def matches(record: Record, now: float) -> bool:
        for field, op, value in terms:
            actual = field_value(record, field, now)
            if op in {"=", "!="}:
                hit = actual is not None and fnmatch.fnmatchcase(actual, value)
            else:
                hit = actual is not None and re.fullmatch(value, actual) is not None
            if hit != (op in {"=", "eq"}):
                return False
        return True

    return matches


def compute_id(text: str) -> str:
    """A stable uint64-looking id (Compute writes ids as strings)."""
    return str(6_000_000_000_000 + zlib.crc32(text.encode("utf-8")))


def fingerprint(text: str) -> str:
    return base64.b64encode(zlib.crc32(text.encode("utf-8")).to_bytes(8, "big")).decode("ascii")
