"""Shared fixtures. Every test gets its own TPULAB_HOME so nothing touches the user's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# google-auth probes the GCE metadata server (a link-local address) when looking for
# credentials; tests must only ever talk to loopback, and subprocesses inherit this.
os.environ["NO_GCE_CHECK"] = "True"


@pytest.fixture(autouse=True)
def tpulab_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "tpulab-home"
    monkeypatch.setenv("TPULAB_HOME", str(home))
    return home


def require_tool(available: bool, what: str) -> None:
    """Skip locally when a system tool is missing, but FAIL in CI: CI must run everything."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required in CI (CI=true) but is not installed")
    pytest.skip(f"{what} is not installed")
