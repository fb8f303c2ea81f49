"""Collect `bench_*.py` here, but only when the benchmarks are asked for by path.

Benchmarks time whole commands and print ratios against a same-run baseline; they are
too slow and too machine-dependent for every `pytest` run, so the normal suite (which
collects `tests/`) skips them and `nox -s bench` (`pytest tests/benchmarks`) runs them.
This directory is a package so this conftest does not shadow `tests/conftest.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def _asked_for(config: pytest.Config) -> bool:
    for arg in config.args:
        target = Path(arg.split("::", 1)[0]).resolve()
        if target == _HERE or _HERE in target.parents:
            return True
    return False


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    is_bench = file_path.suffix == ".py" and file_path.name.startswith("bench_")
    # A bench file named on the command line is collected by pytest itself already.
    if is_bench and not parent.session.isinitpath(file_path) and _asked_for(parent.config):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
