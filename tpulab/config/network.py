"""--network and --subnetwork: the VPC a node is created in (CreateNode's
`networkConfig.network` / `.subnetwork`; gcloud's `tpu-vm create --network` defaults to
`default`, which is also what the API takes when neither is sent).

A project without a `default` network (deleted, or an organisation that never makes one)
can only create in a network it names. Accepted: a Compute resource name
(`[a-z]([-a-z0-9]{0,61}[a-z0-9])?`), or its path (`projects/P/global/networks/N`,
`projects/P/regions/R/subnetworks/S`), as gcloud passes either through unchanged.
"""

from __future__ import annotations

import re

from tpulab.errors import ConfigError

__all__ = ["check_network", "check_subnetwork"]

_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PROJECT = r"[a-z][-a-z0-9.:]{0,98}[a-z0-9]"
_NETWORK = re.compile(rf"^(?:projects/{_PROJECT}/global/networks/)?{_NAME}$")
_SUBNETWORK = re.compile(
    rf"^(?:projects/{_PROJECT}/regions/[a-z]+-[a-z]+[0-9]+/subnetworks/)?{_NAME}$"
)


def check_network(value: str | None, where: str = "--network") -> str | None:
    """`value` stripped, or None when not given; ConfigError naming `where` otherwise."""
    return _check(value, where, _NETWORK, "my-vpc or projects/P/global/networks/my-vpc")


def check_subnetwork(value: str | None, where: str = "--subnetwork") -> str | None:
    """Like `check_network`, for a subnetwork (its region must be the zone's)."""
    return _check(
        value,
        where,
        _SUBNETWORK,
        "my-subnet or projects/P/regions/us-central1/subnetworks/my-subnet",
    )


def _check(value: str | None, where: str, shape: re.Pattern[str], example: str) -> str | None:
    if value is None:
        return None
    text = value.strip()
    if not shape.fullmatch(text):
        raise ConfigError(
            f"Invalid {where} {value!r}.",
            hint=f"Give a VPC name or its path, e.g. {example} (see `gcloud compute "
            "networks list` and `gcloud compute networks subnets list`).",
        )
    return text
