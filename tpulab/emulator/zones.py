"""What each emulated zone offers: accelerator families and runtime versions.

Loosely modelled on the real Cloud TPU regions so that zone mistakes surface offline the
way they would online: asking a zone for a family it does not host is the API's
"invalid AcceleratorType" error, not a stockout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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

    def offers(self, accelerator_type: str) -> bool:
        shape = _TYPE.match(accelerator_type)
        return bool(
            shape
            and shape["family"] in self.families
            and int(shape["size"]) in ACCELERATOR_SIZES.get(shape["family"], ())
        )

    def accelerator_types(self) -> list[str]:
        return [f"{f}-{size}" for f in self.families for size in ACCELERATOR_SIZES[f]]

    def runtime_versions(self) -> list[str]:
        versions = {v for family in self.families for v in _RUNTIMES[family]}
        return sorted(versions)


def accelerator_family(accelerator_type: str) -> str | None:
    shape = _TYPE.match(accelerator_type)
    return shape["family"] if shape else None


_ALL = ("v2", "v3", "v4", "v5litepod", "v5p", "v6e")

ZONES: dict[str, Zone] = {
    zone.name: zone
    for zone in (
        # The emulated default zone offers everything so the demo works for any type.
        Zone("us-central1-a", _ALL),
        Zone("us-central1-b", ("v2", "v3", "v4", "v5litepod")),
        Zone("us-central1-c", ("v2", "v3")),
        Zone("us-central2-b", ("v4",)),
        Zone("us-east1-d", ("v6e",)),
        Zone("us-east5-a", ("v5p", "v6e")),
        Zone("us-south1-a", ("v5litepod", "v6e")),
        Zone("us-west1-c", ("v5litepod",)),
        Zone("us-west4-a", ("v5litepod", "v6e")),
        Zone("europe-west4-a", ("v2", "v3", "v5litepod", "v6e")),
        Zone("europe-west4-b", ("v5litepod", "v5p")),
        Zone("asia-east1-c", ("v2", "v6e")),
        Zone("asia-northeast1-b", ("v6e",)),
    )
}
