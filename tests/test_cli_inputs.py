"""Issue 10 #4: an empty or malformed value is exit 2 and touches nothing.

Each case goes through the real CLI against a real emulator and checks that the
emulator received no API call at all (so nothing was created, listed or deleted), and
that the error names the offending value. Before the fix each of these either fell back
to a default (a different node name, project or zone, or Google itself) or widened a
sweep to every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from tpulab.cli import app
from tpulab.exits import EXIT_CONFIG

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


# Issue 12, "Must show": bad workload input is refused before any create call. Each case
# runs the real CLI with a command after `--` against a real emulator; the words are
# specific, so the old CLI (which had none of these options) fails them.
def workspace_with(tmp_path: Path, name: str, text: str) -> Path:
    root = tmp_path / "lab"
    root.mkdir(exist_ok=True)
    (root / name).write_text(text, encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--workdir", "/nonexistent/lab"], "Workdir /nonexistent/lab does not exist"),
        (["--env", "NOT A NAME=1"], "Malformed --env 'NOT A NAME=1'"),
        (["--env", "JUSTANAME"], "Malformed --env 'JUSTANAME'"),
        (["--env", "JAX_PLATFORMS=cpu"], "--env JAX_PLATFORMS is set by tpulab itself"),
        (["--fetch", "../x"], "--fetch '../x' leaves the workspace"),
        (["--fetch", "/etc/passwd"], "--fetch '/etc/passwd' is not inside the workspace"),
        (["--max-upload", "12 parsecs"], "Invalid --max-upload '12 parsecs'"),
        (["--max-fetch", "0"], "Invalid --max-fetch '0'"),
        (["--with", "--index-url=https://evil.example"], "Invalid --with"),
        (["--requirements", "/nonexistent/req.txt"], "--requirements /nonexistent/req.txt"),
    ],
)
def test_run_with_bad_workload_input_creates_nothing(
    emulator: Emulator, flags: list[str], words: str
) -> None:
    emulator.faults.stockout = True
    code, err = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url, *flags,
        "--", "python", "train.py",
    )  # fmt: skip
    refused(emulator, code, err, words)


def test_unknown_project_file_keys_create_nothing(emulator: Emulator, tmp_path: Path) -> None:
    root = workspace_with(
        tmp_path, "pyproject.toml", '[tool.tpulab]\naccelerator = "v5litepod-4"\nzones = "x"\n'
    )
    emulator.faults.stockout = True
    code, err = tpulab(
        "run", "--api-endpoint", emulator.url, "--workdir", str(root), "--", "python", "t.py"
    )
    refused(emulator, code, err, "Unknown key 'zones'")
    assert "pyproject.toml" in err
    assert "Allowed keys: accelerator, zone" in err


def test_a_workload_flag_without_a_command_creates_nothing(emulator: Emulator) -> None:
    emulator.faults.stockout = True
    code, err = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url, "--fetch", "ckpt/"
    )
    refused(emulator, code, err, "--fetch needs a command after --")


def test_everything_after_the_double_dash_belongs_to_the_command(tmp_path: Path) -> None:
    # `-c` and even `--accelerator` after `--` are the command's, never tpulab's: before,
    # `-c` was "No such option" (exit 2).
    result = CliRunner().invoke(
        app,
        ["run", "--accelerator", "v5litepod-4", "--emulate", "--dry-run", "--json",
         "--workdir", str(tmp_path), "--",
         "python", "-c", "print(1)", "--accelerator", "v6e-8"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["accelerator_type"] == "v5litepod-4"
    assert plan["sources"]["command"] == "--"
    assert plan["sources"]["workdir"] == "--workdir"


def test_the_project_file_makes_accelerator_optional_and_the_plan_says_so(
    tmp_path: Path,
) -> None:
    root = workspace_with(tmp_path, "tpulab.toml", 'accelerator = "v6e-4"\nfetch = ["ckpt/"]\n')
    result = CliRunner().invoke(
        app,
        ["run", "--emulate", "--dry-run", "--json", "--workdir", str(root), "--", "python", "t.py"],
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["accelerator_type"] == "v6e-4"
    assert plan["sources"]["accelerator"] == "tpulab.toml"
    assert plan["sources"]["fetch"] == "tpulab.toml"
    # The human plan names the sources too.
    shown = CliRunner().invoke(
        app, ["run", "--emulate", "--dry-run", "--workdir", str(root), "--", "python", "t.py"]
    )
    assert shown.exit_code == 0, shown.output
    assert "accelerator (tpulab.toml)" in shown.stdout


@pytest.mark.parametrize(
    ("files", "flags", "words"),
    [
        # The upload is chosen in the run's validate phase, before the first API call.
        ({"t.py": "print(1)", "data.bin": "x" * 4096}, ["--max-upload", "1K"], "data.bin"),
        ({"t.py": "print(1)", ".env": "TOKEN=abc\n"}, [], ".env"),
        (
            {"t.py": "print(1)", "keys/deploy": "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n"},
            [],
            "keys/deploy",
        ),
    ],
)
def test_an_upload_over_the_cap_or_with_a_secret_creates_nothing(
    emulator: Emulator, tmp_path: Path, files: dict[str, str], flags: list[str], words: str
) -> None:
    root = tmp_path / "ws"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    emulator.faults.stockout = True
    code, err = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url, "--zone", ZONE,
        "--project", "p-123456", "--workdir", str(root), *flags, "--", "python", "t.py",
    )  # fmt: skip
    refused(emulator, code, err, words)


@pytest.mark.parametrize(
    ("name", "words"), [("", "--name is empty"), ("  ", "--name is empty"), ("Bad", "not valid")]
)
def test_up_with_an_empty_or_bad_name_creates_nothing(
    emulator: Emulator, name: str, words: str
) -> None:
    # Before: `up --name ''` fell back to s-<run id> without a word.
    emulator.faults.stockout = True
    code, err = tpulab(
        "up", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url, "--name", name
    )
    refused(emulator, code, err, words)


def test_up_with_its_name_as_an_argument_says_where_the_name_goes() -> None:
    # As typed after `tpulab down lesson-3`: click's own words say only that it was extra.
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", "up", "lesson-3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_CONFIG
    assert "Got unexpected extra argument" in done.stderr
    assert "hint: `tpulab up` takes the session's name as a flag: `tpulab up --name NAME" in (
        done.stderr
    )


def _emulated_run_with_home(home: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`tpulab run --accelerator v5litepod-4 --emulate`, as typed, with TPULAB_HOME=home."""
    return subprocess.run(
        [sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-4", "--emulate"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env={**os.environ, "TPULAB_HOME": home, "COLUMNS": "300"},
    )


@pytest.mark.parametrize("below", ["", "sub"], ids=["a-file", "under-a-file"])
def test_emulate_with_a_tpulab_home_that_is_a_file_is_a_clear_error(
    tmp_path: Path, below: str
) -> None:
    # Was a NotADirectoryError traceback: the SSH hosts' image directory was made under
    # the emulator's state before the state was first read.
    a_file = tmp_path / "home-file"
    a_file.write_text("")
    home = a_file / below if below else a_file
    done = _emulated_run_with_home(str(home), tmp_path)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "Traceback" not in done.stderr
    assert f"Cannot create the emulator state directory {home / 'state' / 'emulator'}" in (
        done.stderr
    )
    assert "point TPULAB_HOME at a directory you can write to" in done.stderr


def test_a_relative_tpulab_home_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    # Relative, it was another home in each directory: `up` in one, `down` unknown in
    # another, a teardown reading a journal the run never wrote.
    done = _emulated_run_with_home("rel/home", tmp_path)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "TPULAB_HOME is a relative path ('rel/home')" in done.stderr
    assert "TPULAB_HOME=$PWD/rel/home" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no home was made here
