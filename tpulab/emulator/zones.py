"""What each emulated zone offers: accelerator families (and sizes) and runtime versions.

The table follows Google's "TPU regions and zones" page (see `ZONES`) so that zone
mistakes surface offline the way they would online: asking a zone for a type it does
not host is the API's "invalid AcceleratorType" error, not a stockout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ACCELERATOR_SIZES", "ZONES", "Zone", "accelerator_family"]

_BASE = ("tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-tf-2.16.1-pjrt")
_V5E = ("v2-alpha-tpuv5-lite",)
_V5P = ("v2-alpha-tpuv5",)
_V6E = ("v2-alpha-tpuv6e",)

# Sizes the API accepts per family (the emulator lists these as acceleratorTypes).
ACCELERATOR_SIZES: dict[str, tuple[int, ...]] = {
    "v2": (8, 32, 128, 256, 512),
    "v3": (8, 32, 64, 128, 256, 512, 1024, 2048),
    "v4": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),
    "v5p": (8, 16, 32, 64, 128, 256, 512, 1024, 2048),
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),
}
_RUNTIMES = {"v2": _BASE, "v3": _BASE, "v4": _BASE, "v5litepod": _V5E, "v5p": _V5P, "v6e": _V6E}
_TYPE = re.compile(r"^(?P<family>[a-z0-9]+)-(?P<size>\d+)$")


@dataclass(frozen=True)
class Zone:
    name: str
    families: tuple[str, ...]
    only_sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Families the page lists per size in this zone (v2, v3): only these sizes."""

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
        versions = {v for family in self.families for v in _RUNTIMES[family]}
        return sorted(versions)


def accelerator_family(accelerator_type: str) -> str | None:
    shape = _TYPE.match(accelerator_type)
    return shape["family"] if shape else None


# From https://cloud.google.com/tpu/docs/regions-zones ("TPU regions and zones"), read
# offline from stored copies of the page (2025; the North America tables agree across
# every copy). Families are what a zone hosts; v2 and v3 are listed per size there.
# Not modelled: TPU7x, and single-tenant-only zones some copies add. Where the stored
# excerpts were cut off (parts of Europe and Asia Pacific), the rows below marked
# "unconfirmed" keep the emulator's earlier entries rather than invent new ones.
_V2_POD = (32, 128, 256, 512)

ZONES: dict[str, Zone] = {
    zone.name: zone
    for zone in (
        # North America
        Zone("us-central1-a", ("v2", "v3", "v5litepod", "v5p"), {"v2": _V2_POD, "v3": (8,)}),
        Zone("us-central1-b", ("v2", "v3", "v6e"), {"v2": (8,), "v3": (8,)}),
        Zone("us-central1-c", ("v2",), {"v2": (8,)}),
        Zone("us-central2-b", ("v4",)),
        Zone("us-east1-d", ("v6e",)),
        Zone("us-east5-a", ("v5p", "v6e")),
        Zone("us-east5-b", ("v6e",)),
        Zone("us-south1-a", ("v5litepod",)),
        Zone("us-south1-ai1b", ("v6e",)),  # an "AI zone" (the newest copy of the page)
        Zone("us-west1-c", ("v5litepod",)),
        Zone("us-west4-a", ("v5litepod",)),
        # Europe: v2, v3 (all sizes) and v6e in -a; v5e in -b (v5p there: unconfirmed)
        Zone("europe-west4-a", ("v2", "v3", "v6e")),
        Zone("europe-west4-b", ("v5litepod", "v5p")),
        # Asia Pacific: v2-8 in asia-east1-c; v6e in asia-northeast1-b (unconfirmed)
        Zone("asia-east1-c", ("v2",), {"v2": (8,)}),
        Zone("asia-northeast1-b", ("v6e",)),
    )
}
