"""Capacity flags (issue 13): durations, zone lists, retry and recovery options, all
validated before anything is contacted."""

from __future__ import annotations

import pytest

from tpulab.config import parse_duration
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
