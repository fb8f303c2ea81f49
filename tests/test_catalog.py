"""The accelerator catalog against docs/architecture.md §6, suggestions, multi-host refusal,
prices."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import tpulab.emulator as emulated_package
from tpulab import catalog
from tpulab.errors import ConfigError, UnknownAcceleratorError, UnsupportedAcceleratorError

# docs/architecture.md §6, row by row: chips, hosts, JAX devices per host, runtime version.
DESIGN_TABLE = {
    "v2-8": (4, 1, 8, "tpu-ubuntu2204-base"),
    "v3-8": (4, 1, 8, "tpu-ubuntu2204-base"),
    "v4-8": (4, 1, 4, "tpu-ubuntu2204-base"),
    "v4-16": (8, 2, 4, "tpu-ubuntu2204-base"),
    "v4-32": (16, 4, 4, "tpu-ubuntu2204-base"),
    "v4-64": (32, 8, 4, "tpu-ubuntu2204-base"),
    "v5litepod-1": (1, 1, 1, "v2-alpha-tpuv5-lite"),
    "v5litepod-4": (4, 1, 4, "v2-alpha-tpuv5-lite"),
    "v5litepod-8": (8, 1, 8, "v2-alpha-tpuv5-lite"),
    "v5litepod-16": (16, 4, 4, "v2-alpha-tpuv5-lite"),
    "v5litepod-32": (32, 8, 4, "v2-alpha-tpuv5-lite"),
    "v5litepod-64": (64, 16, 4, "v2-alpha-tpuv5-lite"),
    "v5p-8": (4, 1, 4, "v2-alpha-tpuv5"),
    "v5p-16": (8, 2, 4, "v2-alpha-tpuv5"),
    "v5p-32": (16, 4, 4, "v2-alpha-tpuv5"),
    "v6e-1": (1, 1, 1, "v2-alpha-tpuv6e"),
    "v6e-4": (4, 1, 4, "v2-alpha-tpuv6e"),
    "v6e-8": (8, 1, 8, "v2-alpha-tpuv6e"),
    "v6e-16": (16, 4, 4, "v2-alpha-tpuv6e"),
    "v6e-32": (32, 8, 4, "v2-alpha-tpuv6e"),
    "v6e-64": (64, 16, 4, "v2-alpha-tpuv6e"),
    # TPU7x: Compute Engine only; 4 chips of 2 TensorCores per VM, no TPU runtime.
    "tpu7x-8": (4, 1, 8, ""),
}


def test_catalog_matches_the_design_table() -> None:
    assert set(catalog.CATALOG) == set(DESIGN_TABLE)
    for name, (chips, hosts, per_host, runtime) in DESIGN_TABLE.items():
        entry = catalog.lookup(name)
        assert (entry.chips, entry.hosts, entry.devices_per_host) == (chips, hosts, per_host)
        assert entry.runtime_version == runtime
        assert entry.single_host == (hosts == 1)
        assert entry.total_devices == hosts * per_host


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("v5litepod-3", "v5litepod-4"),
        ("v5litepod-5", "v5litepod-4"),
        ("v6e-7", "v6e-8"),
        ("V5LITEPOD-4", "v5litepod-4"),
        ("v4-128", "v4-64"),
        ("v5p-64", "v5p-32"),
    ],
)
def test_unknown_types_suggest_the_nearest(typo: str, suggestion: str) -> None:
    with pytest.raises(UnknownAcceleratorError) as caught:
        catalog.lookup(typo)
    assert caught.value.suggestion == suggestion
    assert f"Did you mean {suggestion!r}?" in caught.value.message
    assert isinstance(caught.value, ConfigError)
    for known in catalog.CATALOG:
        assert known in (caught.value.hint or "")


def test_nonsense_gets_no_suggestion_but_the_list() -> None:
    with pytest.raises(UnknownAcceleratorError) as caught:
        catalog.lookup("a-gpu-please")
    assert caught.value.suggestion is None
    assert "v5litepod-4" in (caught.value.hint or "")


@pytest.mark.parametrize("name", ["v4-16", "v4-32", "v5litepod-16", "v6e-16"])
def test_multi_host_types_are_refused_where_one_host_is_meant(name: str) -> None:
    assert catalog.lookup(name).hosts > 1
    with pytest.raises(UnsupportedAcceleratorError) as caught:
        catalog.lookup_single_host(name, what="thing X", instead="Do Y")
    assert caught.value.message.endswith("thing X works on single-host types only.")
    assert (caught.value.hint or "").startswith("Do Y, or choose a single-host type: v2-8")


def test_single_host_types_pass() -> None:
    assert catalog.lookup_single_host("v5litepod-4", what="x", instead="y").devices_per_host == 4


@pytest.mark.parametrize(
    ("name", "per_chip_hour"),
    [("v5litepod-4", 1.20), ("v6e-8", 2.70), ("v4-8", 3.22), ("v5p-8", 4.20)],
)
def test_prices_are_chips_times_the_design_rate(name: str, per_chip_hour: float) -> None:
    entry = catalog.lookup(name)
    assert entry.price_per_hour() == pytest.approx(entry.chips * per_chip_hour)
    # Spot is roughly a fifth, and cost scales with time.
    assert entry.price_per_hour(spot=True) == pytest.approx(entry.chips * per_chip_hour / 5)
    assert entry.estimated_cost(1800) == pytest.approx(entry.price_per_hour() / 2)
    assert entry.estimated_cost(-5) == 0.0
    assert catalog.PRICE_DATE


@pytest.mark.parametrize("devices", [1, 2, 4, 8, 16, 32])
def test_closed_form_matches_brute_force(devices: int) -> None:
    brute = sum(k * k for k in range(8 * devices))
    assert catalog.closed_form_sum_of_squares(devices) == brute


def test_closed_form_values_of_the_lesson() -> None:
    assert [catalog.closed_form_sum_of_squares(d) for d in (1, 4, 8)] == [140, 10416, 85344]


def test_a_huge_accelerator_flag_is_refused_without_being_echoed_whole() -> None:
    huge = "v5litepod-" + "x" * 100_000
    with pytest.raises(UnknownAcceleratorError) as caught:
        catalog.lookup(huge)
    assert caught.value.suggestion is None
    assert len(caught.value.message) < 300
    assert "100010 characters" in caught.value.message


def _rows_disagree(ours: Mapping[str, Any], emulated: Mapping[str, Any]) -> list[str]:
    """Every zone whose row differs between the catalog's table and the emulator's own."""
    problems = []
    for name in sorted(set(ours) | set(emulated)):
        mine, theirs = ours.get(name), emulated.get(name)
        if mine is None or theirs is None:
            problems.append(f"{name}: only in {'the emulator' if mine is None else 'catalog'}")
        elif sorted(mine.accelerator_types()) != sorted(theirs.accelerator_types()):
            problems.append(f"{name}: types differ")
        elif mine.runtime_versions() != theirs.runtime_versions():
            problems.append(f"{name}: runtimes differ")
    return problems


def _emulator_modules_importing_the_catalog() -> list[str]:
    found = []
    for source in Path(emulated_package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(name == "tpulab.catalog" for name in names) or (
                isinstance(node, ast.ImportFrom)
                and node.module == "tpulab"
                and any(alias.name == "catalog" for alias in node.names)
            ):
                found.append(source.name)
    return found


def test_the_emulator_keeps_its_own_zone_table_and_it_agrees_with_the_catalog() -> None:
    # Two tables, not one: a wrong row shared by both sides could never fail a test.
    from tpulab.emulator import zones as emulated

    assert not _emulator_modules_importing_the_catalog()
    assert _rows_disagree(catalog.ZONES, emulated.ZONES) == []
    assert emulated.ACCELERATOR_SIZES == catalog.ACCELERATOR_SIZES
    # The zone table and the emulator's are the Cloud TPU API's: its types only.
    for accelerator in (a for a in catalog.CATALOG.values() if "tpu-api" in a.providers):
        family = catalog.accelerator_family(accelerator.name) or ""
        assert accelerator.runtime_version in emulated.RUNTIMES[family], accelerator.name
        size = int(accelerator.name.rsplit("-", 1)[1])
        assert size in emulated.ACCELERATOR_SIZES[family], accelerator.name
    # Each of the emulator's rows names the Google page it was read from.
    assert all(zone.source.startswith(emulated.REGIONS_PAGE) for zone in emulated.ZONES.values())
    assert set(emulated.SIZE_SOURCES) == set(emulated.ACCELERATOR_SIZES)


@pytest.mark.parametrize("side", ["catalog", "emulator"])
def test_a_wrong_row_on_either_side_is_caught(side: str) -> None:
    from tpulab.emulator import zones as emulated

    ours: dict[str, Any] = dict(catalog.ZONES)
    theirs: dict[str, Any] = dict(emulated.ZONES)
    wrong = ours if side == "catalog" else theirs
    # us-west4-a hosts v5e only; say it hosts v6e (on one side), or drop a zone.
    wrong["us-west4-a"] = dataclasses.replace(wrong["us-west4-a"], families=("v6e",))
    assert _rows_disagree(ours, theirs) == ["us-west4-a: types differ"]
    del wrong["us-east1-d"]
    assert "us-east1-d: only in " + ("the emulator" if side == "catalog" else "catalog") in (
        _rows_disagree(ours, theirs)
    )


def test_every_catalog_accelerator_is_offered_somewhere() -> None:
    for name, accelerator in catalog.CATALOG.items():
        if accelerator.single_host and "tpu-api" in accelerator.providers:
            assert catalog.zones_offering(name), name


@pytest.mark.parametrize(
    ("name", "first", "includes", "excludes"),
    [
        # From the regions-and-zones page as the table has it (tpulab/catalog.py).
        ("v5litepod-4", "us-central1-a", {"us-west4-a", "europe-west4-b"}, {"us-east1-d"}),
        ("v6e-1", "us-central1-b", {"us-east5-b", "asia-northeast1-b"}, {"us-west4-a"}),
        ("v4-8", "us-central2-b", set(), {"us-central1-a"}),
        ("v3-8", "us-central1-a", {"europe-west4-a"}, {"asia-east1-c"}),
    ],
)
def test_zones_offering_follow_the_table_cheapest_region_first(
    name: str, first: str, includes: set[str], excludes: set[str]
) -> None:
    zones = catalog.zones_offering(name)
    assert zones[0] == first
    assert includes <= set(zones)
    assert not excludes & set(zones)
    assert all(catalog.ZONES[zone].offers(name) for zone in zones)
    # US regions (the cited us-central list prices) before Europe before Asia.
    geography = [0 if z.startswith("us-") else 1 if z.startswith("europe-") else 2 for z in zones]
    assert geography == sorted(geography)


def test_region_of_a_zone_and_of_an_ai_zone() -> None:
    assert catalog.region_of("us-central1-a") == "us-central1"
    assert catalog.region_of("us-south1-ai1b") == "us-south1"
