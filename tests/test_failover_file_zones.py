"""The workspace's `[tool.tpulab] zone` list feeds failover exactly like repeated --zone:
read by the real loader, shown in the real CLI's plan with the file as its source, and
tried in order by a real run against a served emulator (stockout in the first zone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import grouped

from tpulab import catalog
from tpulab.config import RunSpec, TimeoutFlags, run_inputs
from tpulab.emulator.backends import make_host_backend
from tpulab.exits import EXIT_OK
from tpulab.run.report import RunEnvelope

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

SOURCE = "pyproject.toml [tool.tpulab]"
ZONES = ["us-central1-a", "us-west4-a"]


def _workspace(root: Path, zone_line: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    body = f"[project]\nname = 'lab'\n[tool.tpulab]\n{zone_line}\n"
    (root / "pyproject.toml").write_text(textwrap.dedent(body), encoding="utf-8")
    return root


def _spec(workdir: Path, env: dict[str, str] | None = None, **flags: object) -> RunSpec:
    given: dict[str, object] = {
        "accelerator": "v5litepod-4",
        "api_endpoint": "http://127.0.0.1:9",
        "project": "p-1",
        "timeouts": TimeoutFlags(teardown=60.0),
        "env": {"CLOUDSDK_CONFIG": str(workdir / ".no-gcloud"), **(env or {})},
        "cwd": workdir,
    }
    given.update(flags)
    return run_inputs(**grouped(**given)).spec


def test_the_files_zone_list_is_the_failover_order(tmp_path: Path) -> None:
    spec = _spec(_workspace(tmp_path, f"zone = {json.dumps(ZONES)}"))
    assert [(z.value, z.source) for z in spec.zone_order] == [(z, SOURCE) for z in ZONES]
    assert (spec.zone.value, spec.zone.source) == (ZONES[0], SOURCE)
    assert spec.capacity.may_retry


def test_auto_in_the_file_expands_from_the_catalog(tmp_path: Path) -> None:
    spec = _spec(_workspace(tmp_path, 'zone = ["us-west4-a", "auto"]'))
    offering = catalog.zones_offering("v5litepod-4")
    assert [z.value for z in spec.zone_order] == ["us-west4-a"] + [
        z for z in offering if z != "us-west4-a"
    ]
    assert spec.zone_order[0].source == SOURCE
    assert spec.zone_order[1].source == f"{SOURCE} auto (catalog)"


def test_zone_flags_and_the_environment_outrank_the_files_list(tmp_path: Path) -> None:
    workdir = _workspace(tmp_path, f"zone = {json.dumps(ZONES)}")
    flagged = _spec(workdir, zones=["us-south1-a"])
    assert [(z.value, z.source) for z in flagged.zone_order] == [("us-south1-a", "--zone")]
    from_env = _spec(workdir, env={"TPULAB_ZONE": "us-east5-b"})
    assert [(z.value, z.source) for z in from_env.zone_order] == [("us-east5-b", "$TPULAB_ZONE")]


def test_a_bad_zone_in_the_files_list_names_the_file(tmp_path: Path) -> None:
    from tpulab.errors import ConfigError

    with pytest.raises(ConfigError, match="Invalid zone") as caught:
        _spec(_workspace(tmp_path, 'zone = ["us-central1-a", "Mars"]'))
    assert SOURCE in caught.value.message


def _cli(emulator: Emulator, workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [
        sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-4",
        "--api-endpoint", emulator.url, "--project", "file-zones", "--teardown-timeout", "30",
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("TPULAB_ZONE", None)
    env.pop("CLOUDSDK_COMPUTE_ZONE", None)
    env["CLOUDSDK_CONFIG"] = str(workdir / ".no-gcloud")
    return subprocess.run(
        args, capture_output=True, text=True, timeout=240, env=env, cwd=workdir, check=False
    )


def test_dry_run_shows_the_files_zones_and_their_source(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    bare = start_emulator(tmp_path / "bare")
    workdir = _workspace(tmp_path / "lab", f"zone = {json.dumps(ZONES)}")
    done = _cli(bare, workdir, "--dry-run", "--json")
    assert done.returncode == EXIT_OK, done.stderr
    plan = json.loads(done.stdout)
    assert (plan["zone"], plan["zone_source"]) == (ZONES[0], SOURCE)
    assert plan["sources"]["zone"] == SOURCE
    text = _cli(bare, workdir, "--dry-run")
    assert text.returncode == EXIT_OK, text.stderr
    assert f"Attempts: {', '.join(ZONES)}" in text.stdout
    assert bare.requests() == []  # the dry run contacts nothing


@pytest.fixture
def served(start_emulator: EmulatorStarter, tmp_path: Path) -> Iterator[Emulator]:
    backend = make_host_backend("embedded", tmp_path / "ssh-hosts", image="preloaded")
    emulator = start_emulator(tmp_path / "served", host_backend=backend)
    try:
        yield emulator
    finally:
        emulator.stop()
        backend.close()


@pytest.mark.slow
def test_a_run_fails_over_along_the_files_zone_list(served: Emulator, tmp_path: Path) -> None:
    served.faults.stockout_zones = [ZONES[0]]
    workdir = _workspace(tmp_path / "lab", f"zone = {json.dumps(ZONES)}")
    done = _cli(served, workdir, "--json")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    result = RunEnvelope.model_validate_json(done.stdout)
    assert result.zone == ZONES[1]
    assert [(a.zone, a.outcome) for a in result.attempts] == [
        (ZONES[0], "stockout"),
        (ZONES[1], "verified"),
    ]
    assert all(a.teardown_confirmed for a in result.attempts)
    assert served.node_names() == []
