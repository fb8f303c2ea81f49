"""Shared fixtures only (helpers that tests import live in helpers.py). Every test gets
its own TPULAB_HOME so nothing touches the user's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# google-auth probes the GCE metadata server (a link-local address) when looking for
# credentials; tests must only ever talk to loopback, and subprocesses inherit this.
os.environ["NO_GCE_CHECK"] = "True"


@pytest.fixture(autouse=True)
def tpulab_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "tpulab-home"
    monkeypatch.setenv("TPULAB_HOME", str(home))
    return home
