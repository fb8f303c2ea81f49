"""How the full suite runs each benchmark: once, in smoke mode, so a broken benchmark
fails CI instead of rotting until someone asks for the figures.

`pytest tests/benchmarks` (`nox -s bench`) runs them for their figures; any other run
that collects them (`pytest`, `nox -s tests`: the testpaths include this directory) sets
TPULAB_BENCH_SMOKE=1 (tests/benchmarks/conftest.py), and then every benchmark does one
round and asserts no timing goal. Everything else it asserts (the same nodes listed,
the bytes on the wire) it still asserts.
"""

from __future__ import annotations

import os

__all__ = ["SMOKE", "goal", "rounds"]

SMOKE = os.environ.get("TPULAB_BENCH_SMOKE") == "1"


def rounds(figures: int) -> int:
    """How many rounds to time: `figures` for the figures, one in smoke mode."""
    return 1 if SMOKE else figures


def goal(met: bool, what: str) -> None:
    """A timing goal: asserted for the figures, not in smoke mode (one round on a loaded
    machine proves nothing about a timing)."""
    if not SMOKE:
        assert met, what
