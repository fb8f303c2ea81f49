"""Sessions on the Compute Engine provider (docs/reference/providers.md): `tpulab up`
keeps a TPU7x instance, and `exec`, `ssh`, `list` and `down` reach, renew, list and
delete it through Compute, by the provider its session.json names -- never through the
Cloud TPU API, which is blind to instances.

Real subprocesses against an emulator served from this process (the session outlives
each command), whose instances are real SSH servers; `ssh` goes through the system's
OpenSSH client. Nothing is mocked; every test ends by asking the emulator what is left.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import require_tool, served_emulator, tpulab

from tpulab.cleanup.journal import Journal
from tpulab.emulator import Emulator

pytestmark = pytest.mark.slow

PROJECT = "compute-session-proj"
ZONE = "us-central1-c"
IMAGE = "projects/p/global/images/tpu-vm-test-image"
EXIT_OK = 0
EXIT_REMOTE = 4


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def up_args(emulator: Emulator, name: str, *extra: str) -> list[str]:
    return [
        "up", "--accelerator", "tpu7x-8", "--image", IMAGE, "--api-endpoint", emulator.url,
        "--project", PROJECT, "--zone", ZONE, "--boot-timeout", "30", "--name", name, *extra,
    ]  # fmt: skip


def up(emulator: Emulator, name: str, *extra: str) -> dict[str, object]:
    """`tpulab up` on TPU7x (Compute only); the session's state as written to disk."""
    done = tpulab(*up_args(emulator, name, *extra), timeout=300)
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    return json.loads(session_file(name).read_text())  # type: ignore[no-any-return]


def session_file(name: str) -> Path:
    return Path(os.environ["TPULAB_HOME"]) / "state" / "sessions" / name / "session.json"


def tpu_api_paths(emulator: Emulator, since: int = 0) -> list[str]:
    """The Cloud TPU API requests among the emulator's, from request `since` on."""
    return [
        f"{entry['method']} {entry['path']}"
        for entry in emulator.requests()[since:]
        if str(entry["path"]).startswith("/v2/")
    ]


def test_up_exec_ssh_list_down_on_tpu7x_go_through_compute(
    served: Emulator, tmp_path: Path
) -> None:
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")
    state = up(served, "iron", "--ttl", "1h", "--idle", "10m")
    node = str(state["node_name"])
    assert state["provider"] == "compute"
    assert state["accelerator_type"] == "tpu7x-8"
    assert isinstance(state["receipt_id"], str)
    assert served.instance_names(PROJECT) == [node]
    assert served.node_names(PROJECT) == []
    # The instance's watchdog deletes it through Compute, at this endpoint.
    watchdog = state["watchdog"]
    assert isinstance(watchdog, dict)
    assert watchdog["provider"] == "compute"
    assert watchdog["api_base"] == served.url.rstrip("/") + "/"
    after_up = len(served.requests())

    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("import jax; print('devices', jax.device_count())\n")
    done = tpulab(
        "exec", "iron", "--workdir", str(work), "--out", str(tmp_path / "out"), "--",
        "python", "hello.py", timeout=300,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    assert "devices 8" in done.stdout  # TPU7x: 8 TensorCores, one JAX device each
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["session"] == "iron"
    assert record["node_name"] == node

    shell = tpulab("ssh", "iron", "--", "echo", "on-the-instance", timeout=120)
    assert shell.returncode == EXIT_OK, shell.stderr + shell.stdout
    assert "on-the-instance" in shell.stdout

    listed = tpulab(
        "list", "--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE, "--json"
    )
    assert listed.returncode == EXIT_OK, listed.stderr
    envelope = json.loads(listed.stdout)
    assert [(n["name"], n["provider"]) for n in envelope["nodes"]] == [(node, "compute")]
    assert [s["name"] for s in envelope["sessions"]] == ["iron"]
    assert envelope["sessions_gone"] == []

    down = tpulab("down", "iron", timeout=300)
    assert down.returncode == EXIT_OK, down.stderr + down.stdout
    assert f"node {node} deleted, confirmed by list" in down.stdout
    assert not session_file("iron").exists()
    row = Journal().get(str(state["run_id"]))
    assert row is not None
    assert row.teardown == "confirmed"
    assert row.provider == "compute"
    # exec, ssh, list's reading of the session and down asked the TPU API nothing of it.
    assert not [p for p in tpu_api_paths(served, after_up) if node in p]
    assert served.instance_names(PROJECT) == []
    assert served.node_names(PROJECT) == []
