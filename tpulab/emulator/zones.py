"""What each emulated zone offers: the emulator's own copy of Google's published tables.

This is deliberately NOT `tpulab.catalog`'s table. The emulator plays Google: if both
sides read one table, a wrong row (a zone that does not host a type, a size the API
refuses) is accepted by the controller and the "cloud" alike, and no end-to-end test can
notice. So the emulator keeps its own rows, each citing the page it was read from, and
tests/test_catalog.py checks the two tables agree: a wrong row on either side fails it.

Asking a zone for a type it does not host is the API's "invalid AcceleratorType" error,
not a stockout (state.py), as it is online.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ACCELERATOR_SIZES", "RUNTIMES", "ZONES", "Zone", "accelerator_family"]

# Google's pages the rows below were read from (stored copies, 2025).
REGIONS_PAGE = "https://cloud.google.com/tpu/docs/regions-zones"
_V2_PAGE = "https://cloud.google.com/tpu/docs/v2"
_V3_PAGE = "https://cloud.google.com/tpu/docs/v3"
_V4_PAGE = "https://cloud.google.com/tpu/docs/v4"
_V5E_PAGE = "https://cloud.google.com/tpu/docs/v5e"
_V5P_PAGE = "https://cloud.google.com/tpu/docs/v5p"
_V6E_PAGE = "https://cloud.google.com/tpu/docs/v6e"
_RUNTIMES_PAGE = "https://cloud.google.com/tpu/docs/runtimes"

# The accelerator catalog as the API lists it (acceleratorTypes): the sizes each family
# accepts, from each generation's page (its "configurations" table).
ACCELERATOR_SIZES: dict[str, tuple[int, ...]] = {
    "v2": (8, 32, 128, 256, 512),  # _V2_PAGE
    "v3": (8, 32, 64, 128, 256, 512, 1024, 2048),  # _V3_PAGE
    "v4": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),  # _V4_PAGE
    "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),  # _V5E_PAGE
    "v5p": (8, 16, 32, 64, 128, 256, 512, 1024, 2048),  # _V5P_PAGE
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),  # _V6E_PAGE
}
SIZE_SOURCES = {
    "v2": _V2_PAGE,
    "v3": _V3_PAGE,
    "v4": _V4_PAGE,
    "v5litepod": _V5E_PAGE,
    "v5p": _V5P_PAGE,
    "v6e": _V6E_PAGE,
}

# Runtime versions (software versions) per family, from the runtimes page.
_TPU_VM_BASE = ("tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-tf-2.16.1-pjrt")
RUNTIMES: dict[str, tuple[str, ...]] = {
    "v2": _TPU_VM_BASE,
    "v3": _TPU_VM_BASE,
    "v4": _TPU_VM_BASE,
    "v5litepod": ("v2-alpha-tpuv5-lite",),
    "v5p": ("v2-alpha-tpuv5",),
    "v6e": ("v2-alpha-tpuv6e",),
}
RUNTIMES_SOURCE = _RUNTIMES_PAGE

_TYPE = re.compile(r"^(?P<family>[a-z0-9]+)-(?P<size>\d+)$")


@dataclass(frozen=True)
class Zone:
    """One row of the regions-and-zones page: the families a zone hosts, and where the
    page lists a family per size (v2, v3), only those sizes."""

    name: str
    families: tuple[str, ...]
    only_sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    source: str = REGIONS_PAGE

    def sizes(self, family: str) -> tuple[int, ...]:
        return self.only_sizes.get(family, ACCELERATOR_SIZES.get(family, ()))

    def offers(self, accelerator_type: str) -> bool:
        shape = _TYPE.match(accelerator_type)
        return bool(
            shape
            and shape["family"] in self.families
            and int(shape["size"]) in self.sizes(shape["family"])
        )

    def accelerator_types(self) -> list[str]:
        return [f"{f}-{size}" for f in self.families for size in self.sizes(f)]

    def runtime_versions(self) -> list[str]:
        return sorted({v for family in self.families for v in RUNTIMES[family]})


def accelerator_family(accelerator_type: str) -> str | None:
    """The API's family of a type name ("v5litepod" for v5litepod-4)."""
    shape = _TYPE.match(accelerator_type)
    return shape["family"] if shape else None


_V2_POD = (32, 128, 256, 512)
_NA = REGIONS_PAGE + "#north_america"
_EU = REGIONS_PAGE + "#europe"
_AP = REGIONS_PAGE + "#asia_pacific"

# Not modelled: TPU7x, and single-tenant-only zones some copies of the page add. Rows
# marked "unconfirmed" are where the stored copies were cut off; they keep the earlier
# entries rather than invent new ones.
ZONES: dict[str, Zone] = {
    zone.name: zone
    for zone in (
        Zone("us-central1-a", ("v2", "v3", "v5litepod", "v5p"), {"v2": _V2_POD, "v3": (8,)}, _NA),
        Zone("us-central1-b", ("v2", "v3", "v6e"), {"v2": (8,), "v3": (8,)}, _NA),
        Zone("us-central1-c", ("v2",), {"v2": (8,)}, _NA),
        Zone("us-central2-b", ("v4",), source=_NA),
        Zone("us-east1-d", ("v6e",), source=_NA),
        Zone("us-east5-a", ("v5p", "v6e"), source=_NA),
        Zone("us-east5-b", ("v6e",), source=_NA),
        Zone("us-south1-a", ("v5litepod",), source=_NA),
        Zone("us-south1-ai1b", ("v6e",), source=_NA + " (an AI zone, newest copy)"),
        Zone("us-west1-c", ("v5litepod",), source=_NA),
        Zone("us-west4-a", ("v5litepod",), source=_NA),
        Zone("europe-west4-a", ("v2", "v3", "v6e"), source=_EU),
        Zone("europe-west4-b", ("v5litepod", "v5p"), source=_EU + " (v5p unconfirmed)"),
        Zone("asia-east1-c", ("v2",), {"v2": (8,)}, _AP),
        Zone("asia-northeast1-b", ("v6e",), source=_AP + " (unconfirmed)"),
    )
}
