"""Issue 10 #4: an empty or malformed value is exit 2 and touches nothing.

Each case goes through the real CLI against a real emulator and checks that the
emulator received no API call at all (so nothing was created, listed or deleted), and
that the error names the offending value. Before the fix each of these either fell back
to a default (a different node name, project or zone, or Google itself) or widened a
sweep to every run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from tpulab.cli import EXIT_CONFIG, app

if TYPE_CHECKING:
    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

ZONE = "us-central1-a"


@pytest.fixture(autouse=True)
def no_cloud_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing from this machine's gcloud or environment may choose project or zone."""
    for name in list(os.environ):
        if name.startswith(("CLOUDSDK_", "TPULAB_PROJECT", "TPULAB_ZONE", "GOOGLE_CLOUD")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "empty-gcloud-config"))


def tpulab(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stderr


def refused(emulator: Emulator, code: int, err: str, words: str) -> None:
    assert code == EXIT_CONFIG, err
    assert words in err
    assert sum(emulator.calls.values()) == 0, dict(emulator.calls)
    assert emulator.node_names() == []


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--name", ""], "--name is empty"),
        (["--project", ""], "--project is empty"),
        (["--zone", ""], "--zone is empty"),
        (["--zone", "us-central1-a", "--project", "Bad Project"], "Invalid project id"),
    ],
)
def test_run_with_an_empty_flag_creates_nothing(
    emulator: Emulator, flags: list[str], words: str
) -> None:
    # A stockout makes the old behaviour (creating with a default) fail fast, not hang.
    emulator.faults.stockout = True
    code, err = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url, *flags
    )
    refused(emulator, code, err, words)


def test_run_with_a_bogus_zone_variable_does_not_fall_back(emulator: Emulator) -> None:
    emulator.faults.stockout = True
    code, err = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        env={"TPULAB_ZONE": "bogus"},
    )  # fmt: skip
    refused(emulator, code, err, "$TPULAB_ZONE")


def test_run_with_an_empty_endpoint_does_not_target_google() -> None:
    # Before: '' read as "no endpoint", so the run (here its dry run) went to Google.
    code, err = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", "", "--project", "p-1",
        "--zone", ZONE, "--dry-run",
    )  # fmt: skip
    assert code == EXIT_CONFIG, err
    assert "--api-endpoint is empty" in err


def test_teardown_with_an_empty_run_id_sweeps_nothing(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    from emulator_fixtures import node_request

    for run in ("run-a", "run-b"):
        tpu_api.wait_operation(
            tpu_api.create_node(ZONE, f"tpulab-{run}", node_request(run_id=run)), timeout=30
        )
    emulator.calls.clear()
    code, err = tpulab(
        "teardown", "--verify", "--run-id", "", "--yes", "--api-endpoint", emulator.url,
        "--zone", ZONE,
    )  # fmt: skip
    assert code == EXIT_CONFIG, err
    assert "run id is empty" in err
    assert sum(emulator.calls.values()) == 0, dict(emulator.calls)
    assert sorted(emulator.node_names()) == ["tpulab-run-a", "tpulab-run-b"]


def test_teardown_refuses_a_malformed_project(emulator: Emulator) -> None:
    code, err = tpulab(
        "teardown", "--verify", "--project", "Bad Project", "--yes", "--api-endpoint",
        emulator.url, "--zone", ZONE,
    )  # fmt: skip
    refused(emulator, code, err, "Invalid project id 'Bad Project'")


def test_list_refuses_an_empty_zone_flag(emulator: Emulator) -> None:
    code, err = tpulab("list", "--api-endpoint", emulator.url, "--zone", "")
    refused(emulator, code, err, "--zone is empty")
