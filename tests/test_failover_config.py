"""Capacity flags (issue 13): durations, zone lists, retry and recovery options, all
validated before anything is contacted."""

from __future__ import annotations

import pytest
from helpers import grouped

from tpulab import catalog
from tpulab.config import RunSpec, parse_duration, run_inputs
from tpulab.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("20s", 20.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("90", 90.0),
        ("1.5m", 90.0),
        (" 2D ", 172800.0),
    ],
)
def test_parse_duration_reads_units(text: str, seconds: float) -> None:
    assert parse_duration("--retry-for", text) == seconds


@pytest.mark.parametrize("text", ["", "s", "10x", "-5s", "0s", "10 m", "1h-3m", "m10", "nan"])
def test_parse_duration_rejects_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_duration("--retry-for", text)
    assert "--retry-for" in caught.value.message
    assert "20s" in (caught.value.hint or "")


def _spec(**overrides: object) -> RunSpec:
    flags = {"accelerator": "v5litepod-4", "emulate": True, "env": {}, **overrides}
    return run_inputs(**grouped(**flags)).spec


def test_zone_flags_repeat_and_take_comma_lists_in_order() -> None:
    spec = _spec(zones=["us-west4-a,us-central1-a", "us-south1-a", "us-west4-a"])
    assert [z.value for z in spec.zone_order] == ["us-west4-a", "us-central1-a", "us-south1-a"]
    assert spec.zone.value == "us-west4-a"  # the first attempt's zone
    assert {z.source for z in spec.zone_order} == {"--zone"}


def test_zone_auto_expands_from_the_catalog_cheapest_region_first() -> None:
    spec = _spec(zones=["auto"])
    assert [z.value for z in spec.zone_order] == catalog.zones_offering("v5litepod-4")
    assert spec.zone.value == "us-central1-a"
    assert spec.zone.source == "--zone auto (catalog)"
    # Explicit zones keep their place before the catalog's.
    mixed = _spec(zones=["us-west4-a", "auto"])
    assert [z.value for z in mixed.zone_order][:2] == ["us-west4-a", "us-central1-a"]


def test_without_zone_flags_the_configured_zone_is_the_only_one() -> None:
    spec = _spec(
        emulate=False, api_endpoint="http://127.0.0.1:9", env={"TPULAB_ZONE": "us-east5-b"}
    )
    assert [(z.value, z.source) for z in spec.zone_order] == [("us-east5-b", "$TPULAB_ZONE")]
    assert spec.zones == ()


def test_retry_and_recovery_flags_reach_the_spec() -> None:
    spec = _spec(spot=True, recover=2, retry_until_up=True, retry_for="20m")
    assert (spec.recover, spec.retry_until_up, spec.retry_for) == (2, True, 1200.0)
    assert _spec(retry_until_up=True).retry_for is None  # until Ctrl-C


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"recover": 1}, "--recover needs --spot"),
        ({"spot": True, "recover": -1}, "Invalid --recover"),
        ({"spot": True, "recover": 99}, "more than"),
        ({"retry_for": "20s"}, "--retry-for needs --retry-until-up"),
        ({"retry_until_up": True, "retry_for": "soon"}, "Invalid --retry-for"),
        ({"retry_until_up": True, "retry_for": "3d"}, "Invalid --retry-for"),
        ({"zones": ["us-central1-a,,us-west4-a"]}, "empty entry"),
        ({"zones": ["us-central1-a", "Mars-1"]}, "Invalid zone"),
        ({"zones": ["auto"], "accelerator": "v4-1024"}, "Unknown accelerator"),
        ({"zones": ["us-central1-a", "us-west4-a"], "name": "n" * 60}, "no room"),
    ],
)
def test_bad_capacity_flags_are_refused_before_anything_is_contacted(
    overrides: dict[str, object], words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _spec(**overrides)
    assert words in caught.value.message
    assert caught.value.hint


def test_a_long_name_is_fine_for_a_single_attempt() -> None:
    assert _spec(name="n" * 60).node_name == "n" * 60


def test_attempt_specs_name_each_attempt_apart() -> None:
    from tpulab.run.attempts import attempt_spec

    spec = _spec(zones=["us-central1-a", "auto"], spot=True, recover=1)
    second = attempt_spec(spec, 2, "us-west4-a")
    assert second.run_id == f"{spec.run_id}-a2"
    assert second.node_name == f"{spec.node_name}-a2"
    assert (second.zone.value, second.zone.source) == ("us-west4-a", "--zone auto (catalog)")
    assert second.labels["tpulab-run"] == second.run_id  # teardown --verify finds it
    assert attempt_spec(spec, 1, "us-central1-a") == spec


def test_the_gap_between_passes_is_jittered_and_bounded() -> None:
    import random

    from tpulab.polling import Backoff

    delays = iter(Backoff.gap(10.0, cap=20.0, jitter=0.3, rng=random.Random(7)))
    first = [next(delays) for _ in range(30)]
    assert all(7.0 <= d <= 20.0 for d in first)
    assert len({round(d, 6) for d in first[:3]}) == 3  # spread, not in step
    assert first[-1] <= 20.0
