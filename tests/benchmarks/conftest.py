"""Collect `bench_*.py` here: for their figures when the benchmarks are asked for by path
(`nox -s bench`, `pytest tests/benchmarks`), else once each in smoke mode.

Benchmarks time whole commands and print ratios against a same-run baseline; for the
figures they take many rounds on a quiet machine. Every other run that reaches this
directory (the whole suite) runs each of them once, one round and no timing goal
(tests/benchmarks/smoke.py), so a benchmark that breaks fails CI the day it breaks.
This directory is a package so this conftest does not shadow `tests/conftest.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def _asked_for(config: pytest.Config) -> bool:
    for arg in config.args:
        target = Path(arg.split("::", 1)[0]).resolve()
        if target == _HERE or _HERE in target.parents:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    # Before any bench module is imported: they read it for their ROUNDS. Set by hand
    # (TPULAB_BENCH_SMOKE=1 pytest tests/benchmarks/...), it is kept.
    os.environ.setdefault("TPULAB_BENCH_SMOKE", "0" if _asked_for(config) else "1")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    is_bench = file_path.suffix == ".py" and file_path.name.startswith("bench_")
    # A bench file named on the command line is collected by pytest itself already.
    if is_bench and not parent.session.isinitpath(file_path):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
