"""The accelerator types tpulab knows, and what a healthy node of each must show.

Facts come from the Cloud TPU documentation (DESIGN.md §6). v2/v3/v4/v5p names count
TensorCores; v5litepod/v6e names count chips, which is why `v2-8` has 4 chips but 8 JAX
devices while `v5litepod-8` has 8 of each. Prices are list estimates, shown as such.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from tpulab.errors import UnknownAcceleratorError, UnsupportedAcceleratorError

__all__ = [
    "CATALOG",
    "PRICE_DATE",
    "Accelerator",
    "closed_form_sum_of_squares",
    "lookup",
    "lookup_single_host",
]

# On-demand list prices per chip-hour in us-central, USD. Spot is roughly a fifth.
PRICE_DATE = "2026-11"
_PRICE_PER_CHIP_HOUR = {"v2": 1.125, "v3": 2.00, "v4": 3.22, "v5e": 1.20, "v5p": 4.20, "v6e": 2.70}
_SPOT_FRACTION = 0.2


@dataclass(frozen=True)
class Accelerator:
    name: str
    generation: str
    chips: int
    hosts: int
    devices_per_host: int
    runtime_version: str

    @property
    def single_host(self) -> bool:
        return self.hosts == 1

    @property
    def total_devices(self) -> int:
        return self.hosts * self.devices_per_host

    def price_per_hour(self, *, spot: bool = False) -> float:
        """Estimated USD per hour for the whole slice (see PRICE_DATE)."""
        price = self.chips * _PRICE_PER_CHIP_HOUR[self.generation]
        return round(price * (_SPOT_FRACTION if spot else 1.0), 4)

    def estimated_cost(self, seconds: float, *, spot: bool = False) -> float:
        return self.price_per_hour(spot=spot) * max(seconds, 0.0) / 3600.0


def _acc(name: str, gen: str, chips: int, hosts: int, per_host: int, runtime: str) -> Accelerator:
    return Accelerator(name, gen, chips, hosts, per_host, runtime)


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
        _acc("v5litepod-1", "v5e", 1, 1, 1, _V5E),
        _acc("v5litepod-4", "v5e", 4, 1, 4, _V5E),
        _acc("v5litepod-8", "v5e", 8, 1, 8, _V5E),
        _acc("v5litepod-16", "v5e", 16, 4, 4, _V5E),
        _acc("v5p-8", "v5p", 4, 1, 4, _V5P),
        _acc("v6e-1", "v6e", 1, 1, 1, _V6E),
        _acc("v6e-4", "v6e", 4, 1, 4, _V6E),
        _acc("v6e-8", "v6e", 8, 1, 8, _V6E),
        _acc("v6e-16", "v6e", 16, 4, 4, _V6E),
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


def lookup_single_host(name: str) -> Accelerator:
    """Like `lookup`, but refuses multi-host slices, which `run` cannot drive yet."""
    accelerator = lookup(name)
    if not accelerator.single_host:
        single = ", ".join(a.name for a in CATALOG.values() if a.single_host)
        raise UnsupportedAcceleratorError(
            f"{name} is a multi-host slice ({accelerator.hosts} hosts); "
            "multi-host slices are not supported yet.",
            hint=f"Choose a single-host type: {single}",
        )
    return accelerator


def closed_form_sum_of_squares(devices: int, width: int = 8) -> int:
    """S(D) = sum of k^2 for k in 0..8D-1, the oracle for the payload's pmap total."""
    n = devices * width
    return (n - 1) * n * (2 * n - 1) // 6
