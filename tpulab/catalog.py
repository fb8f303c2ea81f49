"""The accelerator types tpulab knows, and what a healthy node of each must show.

Facts come from the Cloud TPU documentation (docs/architecture.md §6). v2/v3/v4/v5p names count
TensorCores; v5litepod/v6e names count chips, which is why `v2-8` has 4 chips but 8 JAX
devices while `v5litepod-8` has 8 of each. Prices are list estimates, shown as such.

The zone table (`ZONES`: which zone offers which family) lives here too, for
`--zone auto` (`zones_offering`). The emulator keeps its own copy of Google's tables
(tpulab/emulator/zones.py), so that a wrong row here is refused by the emulated API as it
would be online; tests/test_catalog.py checks that the two agree.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from tpulab.errors import ConfigError, UnknownAcceleratorError, UnsupportedAcceleratorError

__all__ = [
    "ACCELERATOR_SIZES",
    "CATALOG",
    "PRICE_DATE",
    "PROVIDERS",
    "ZONES",
    "Accelerator",
    "Provider",
    "Zone",
    "accelerator_family",
    "check_provider",
    "closed_form_sum_of_squares",
    "lookup",
    "lookup_single_host",
    "region_of",
    "vm_kind",
    "zones_offering",
]

# On-demand list prices per chip-hour in us-central, USD. Spot is roughly a fifth.
PRICE_DATE = "2026-11"
_PRICE_PER_CHIP_HOUR = {"v2": 1.125, "v3": 2.00, "v4": 3.22, "v5e": 1.20, "v5p": 4.20, "v6e": 2.70}
_SPOT_FRACTION = 0.2

# Who serves a type (docs/reference/providers.md): the Cloud TPU API (nodes) or Compute
# Engine (VM instances with a TPU machine type). The first a row names is its default.
Provider = Literal["tpu-api", "compute"]
PROVIDERS: tuple[Provider, ...] = ("tpu-api", "compute")
_TPU_API: tuple[Provider, ...] = ("tpu-api",)
_BOTH: tuple[Provider, ...] = ("tpu-api", "compute")
_COMPUTE: tuple[Provider, ...] = ("compute",)


def vm_kind(provider: str) -> str:
    """What `provider` calls the VM, for what the user reads: "node" (Cloud TPU API) or
    "instance" (Compute Engine), as gcloud names them."""
    return "instance" if provider == "compute" else "node"


@dataclass(frozen=True)
class Accelerator:
    name: str
    generation: str
    chips: int
    hosts: int
    devices_per_host: int
    runtime_version: str
    providers: tuple[Provider, ...] = _TPU_API
    # Compute Engine's machine type for this shape (one VM); None: not on Compute.
    machine_type: str | None = None

    @property
    def single_host(self) -> bool:
        return self.hosts == 1

    @property
    def default_provider(self) -> Provider:
        return self.providers[0]

    @property
    def priced(self) -> bool:
        """Whether a list price is cited for this generation (TPU7x: none found)."""
        return self.generation in _PRICE_PER_CHIP_HOUR

    @property
    def total_devices(self) -> int:
        return self.hosts * self.devices_per_host

    def price_per_hour(self, *, spot: bool = False) -> float:
        """Estimated USD per hour for the whole slice (see PRICE_DATE); 0.0 for a
        generation without a cited price (`priced` says which: costs show it unknown)."""
        price = self.chips * _PRICE_PER_CHIP_HOUR.get(self.generation, 0.0)
        return round(price * (_SPOT_FRACTION if spot else 1.0), 4)

    def estimated_cost(self, seconds: float, *, spot: bool = False) -> float:
        return self.price_per_hour(spot=spot) * max(seconds, 0.0) / 3600.0


def _acc(
    name: str,
    gen: str,
    chips: int,
    hosts: int,
    per_host: int,
    runtime: str,
    providers: tuple[Provider, ...] = _TPU_API,
    machine_type: str | None = None,
) -> Accelerator:
    return Accelerator(name, gen, chips, hosts, per_host, runtime, providers, machine_type)


_BASE = "tpu-ubuntu2204-base"
_V5E = "v2-alpha-tpuv5-lite"
_V5P = "v2-alpha-tpuv5"
_V6E = "v2-alpha-tpuv6e"

CATALOG: dict[str, Accelerator] = {
    a.name: a
    for a in (
        _acc("v2-8", "v2", 4, 1, 8, _BASE),
        _acc("v3-8", "v3", 4, 1, 8, _BASE),
        _acc("v4-8", "v4", 4, 1, 4, _BASE),
        _acc("v4-16", "v4", 8, 2, 4, _BASE),
        _acc("v4-32", "v4", 16, 4, 4, _BASE),
        _acc("v4-64", "v4", 32, 8, 4, _BASE),
        _acc("v5litepod-1", "v5e", 1, 1, 1, _V5E),
        _acc("v5litepod-4", "v5e", 4, 1, 4, _V5E),
        _acc("v5litepod-8", "v5e", 8, 1, 8, _V5E),
        _acc("v5litepod-16", "v5e", 16, 4, 4, _V5E),
        _acc("v5litepod-32", "v5e", 32, 8, 4, _V5E),
        _acc("v5litepod-64", "v5e", 64, 16, 4, _V5E),
        # Compute machine types: ct5p-hightpu-4t, ct6e-standard-{1,4,8}t, tpu7x-standard-4t
        # (the suffix counts chips per VM); sources in docs/reference/providers.md.
        _acc("v5p-8", "v5p", 4, 1, 4, _V5P, _BOTH, "ct5p-hightpu-4t"),
        _acc("v5p-16", "v5p", 8, 2, 4, _V5P),
        _acc("v5p-32", "v5p", 16, 4, 4, _V5P),
        _acc("v6e-1", "v6e", 1, 1, 1, _V6E, _BOTH, "ct6e-standard-1t"),
        _acc("v6e-4", "v6e", 4, 1, 4, _V6E, _BOTH, "ct6e-standard-4t"),
        _acc("v6e-8", "v6e", 8, 1, 8, _V6E, _BOTH, "ct6e-standard-8t"),
        _acc("v6e-16", "v6e", 16, 4, 4, _V6E),
        _acc("v6e-32", "v6e", 32, 8, 4, _V6E),
        _acc("v6e-64", "v6e", 64, 16, 4, _V6E),
        # TPU7x (Ironwood): Compute Engine (or GKE) only. One VM has 4 chips of two
        # TensorCores each; named like v5p by TensorCores (tpu7x-8 = 4 chips), each
        # TensorCore one JAX device. No runtime version: Compute boots an image.
        _acc("tpu7x-8", "tpu7x", 4, 1, 8, "", _COMPUTE, "tpu7x-standard-4t"),
    )
}

_NAME_SHAPE = re.compile(r"^(?P<family>[a-z0-9]+)-(?P<size>\d+)$")


def _suggest(name: str) -> str | None:
    """Nearest known type: same family and closest size first, then spelling."""
    shape = _NAME_SHAPE.match(name.strip().lower())
    if shape:
        family, size = shape["family"], int(shape["size"])
        same_family = [
            (abs(int(m["size"]) - size), int(m["size"]), known)
            for known in CATALOG
            if (m := _NAME_SHAPE.match(known)) and m["family"] == family
        ]
        if same_family:
            return min(same_family)[2]
    if len(name) > 32:
        return None  # no type name is that long; difflib on it would only be slow
    close = difflib.get_close_matches(name.lower(), list(CATALOG), n=1, cutoff=0.5)
    return close[0] if close else None


def lookup(name: str) -> Accelerator:
    """The catalog entry for `name`, or UnknownAcceleratorError naming the nearest one."""
    try:
        return CATALOG[name]
    except KeyError:
        raise UnknownAcceleratorError(name, _suggest(name), list(CATALOG)) from None


def lookup_single_host(name: str, *, what: str, instead: str) -> Accelerator:
    """Like `lookup`, but refuses a multi-host slice for `what` (a command that works on
    one host only), saying what to do `instead`."""
    accelerator = lookup(name)
    if not accelerator.single_host:
        single = ", ".join(a.name for a in CATALOG.values() if a.single_host)
        raise UnsupportedAcceleratorError(
            f"{name} is a multi-host slice ({accelerator.hosts} hosts); {what} works on "
            "single-host types only.",
            hint=f"{instead}, or choose a single-host type: {single}",
        )
    return accelerator


def check_provider(accelerator: Accelerator, provider: Provider) -> None:
    """ConfigError, before any call, when `provider` does not serve `accelerator`."""
    if provider in accelerator.providers and (
        provider != "compute" or accelerator.machine_type is not None
    ):
        return
    served = " or ".join(accelerator.providers)
    if provider == "compute" and not accelerator.single_host and "compute" not in served:
        on_compute = ", ".join(a.name for a in CATALOG.values() if "compute" in a.providers)
        raise ConfigError(
            f"{accelerator.name} is a multi-host slice ({accelerator.hosts} hosts): on "
            "Compute Engine that is a managed instance group with a workload policy, which "
            "tpulab does not create yet.",
            hint=f"Use --provider tpu-api for {accelerator.name}, or a single-host type on "
            f"Compute: {on_compute}.",
        )
    raise ConfigError(
        f"{accelerator.name} is not served by the {provider} provider (only {served}).",
        hint=f"Pass --provider {accelerator.default_provider}, or leave --provider out "
        "for the accelerator's default.",
    )


def closed_form_sum_of_squares(devices: int, width: int = 8) -> int:
    """S(D) = sum of k^2 for k in 0..8D-1, the oracle for the payload's pmap total."""
    n = devices * width
    return (n - 1) * n * (2 * n - 1) // 6


# -- zones ----------------------------------------------------------------------

_ZONE_BASE = ("tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-tf-2.16.1-pjrt")

# Sizes the API accepts per family (the emulator lists these as acceleratorTypes).
ACCELERATOR_SIZES: dict[str, tuple[int, ...]] = {
    "v2": (8, 32, 128, 256, 512),
    "v3": (8, 32, 64, 128, 256, 512, 1024, 2048),
    "v4": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),
    "v5p": (8, 16, 32, 64, 128, 256, 512, 1024, 2048),
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),
}
_RUNTIMES = {
    "v2": _ZONE_BASE,
    "v3": _ZONE_BASE,
    "v4": _ZONE_BASE,
    "v5litepod": (_V5E,),
    "v5p": (_V5P,),
    "v6e": (_V6E,),
}


@dataclass(frozen=True)
class Zone:
    name: str
    families: tuple[str, ...]
    only_sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Families the page lists per size in this zone (v2, v3): only these sizes."""

    def sizes(self, family: str) -> tuple[int, ...]:
        return self.only_sizes.get(family, ACCELERATOR_SIZES.get(family, ()))

    def offers(self, accelerator_type: str) -> bool:
        shape = _NAME_SHAPE.match(accelerator_type)
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
    """The API's family of a type name ("v5litepod" for v5litepod-4)."""
    shape = _NAME_SHAPE.match(accelerator_type)
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


def region_of(zone: str) -> str:
    """us-central1 for us-central1-a (and for the AI zone us-central1-ai1a)."""
    return zone.rsplit("-", 1)[0]


# Which regions cost least. Only us-central list prices are cited (docs/architecture.md §6, the
# prices above); Cloud TPU's other regions list at those prices or above, US regions
# lowest, so the order is US, then Europe, then Asia, and the table's order within
# each. An ordering, not prices: estimates everywhere use the us-central figures.
_CHEAPEST_GEOGRAPHY_FIRST = ("us-", "europe-", "asia-")


def _price_rank(zone: str) -> int:
    for rank, prefix in enumerate(_CHEAPEST_GEOGRAPHY_FIRST):
        if zone.startswith(prefix):
            return rank
    return len(_CHEAPEST_GEOGRAPHY_FIRST)


def zones_offering(accelerator_type: str) -> list[str]:
    """Zones the table says offer `accelerator_type`, cheapest region first (`--zone
    auto`); empty when none does."""
    offering = [name for name, zone in ZONES.items() if zone.offers(accelerator_type)]
    return sorted(offering, key=_price_rank)  # stable: the table's order within a rank
