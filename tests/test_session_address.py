"""A session's node that moved (issue 20, defect 11): a real VM's ephemeral external IP
can change, and a restarted emulator gives its nodes new SSH ports. `ssh` used to say
the node "may have deleted itself" while it was READY, and `exec` retried the old
address for 60 s and exited 4. Now both ask the API where the node is (GetNode, and the
emulator's port attribute), save it in the session's state and connect there -- with
the host key `up` pinned, so another machine at the new address is still refused.
Real `up`, OpenSSH and emulator restarts; nothing is mocked."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import refused_port, require_tool, tpulab

from tpulab.emulator import Emulator
from tpulab.emulator.hostenv import preloaded_image_env
from tpulab.emulator.sshhost import EmbeddedHostBackend
from tpulab.emulator.timing import Timing


@pytest.fixture(autouse=True)
def _ssh_client() -> None:
    """`tpulab ssh` runs the OpenSSH client: skipped without it here, failed in CI."""
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")


PROJECT = "moved-proj"
ZONE = "us-central1-a"
EXIT_OK = 0
EXIT_REMOTE = 4
QUICK = Timing(create_seconds=0.3, delete_seconds=0.3)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[EmbeddedHostBackend]:
    hosts = EmbeddedHostBackend(tmp_path / "emulator", image=preloaded_image_env())
    try:
        yield hosts
    finally:
        hosts.close()


def _state_path(name: str) -> Path:
    return Path(os.environ["TPULAB_HOME"]) / "state" / "sessions" / name / "session.json"


def _state(name: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(_state_path(name).read_text())
    return loaded


def _up(url: str, name: str) -> dict[str, object]:
    done = tpulab(
        "up", "--accelerator", "v5litepod-4", "--api-endpoint", url, "--project", PROJECT,
        "--zone", ZONE, "--boot-timeout", "30", "--name", name, "--ttl", "1h", "--idle", "30m",
        timeout=300,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    return _state(name)


def _move_in_state(name: str, port: int) -> None:
    """The session's saved address made stale: where the node was, not where it is."""
    state = _state(name)
    state["ssh_port"] = port
    _state_path(name).write_text(json.dumps(state))


def _workspace(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "hello.py").write_text("print('hello from the moved node')\n")
    return work


def test_ssh_and_exec_follow_a_node_that_moved(
    backend: EmbeddedHostBackend, tmp_path: Path
) -> None:
    with Emulator(tmp_path / "emulator", host_backend=backend, timing=QUICK) as emulator:
        real_port = _up(emulator.url, "moved")["ssh_port"]
        with refused_port() as stale:
            _move_in_state("moved", stale)
            shell = tpulab("ssh", "moved", "--", "echo", "on-the-node", timeout=120)
            assert shell.returncode == EXIT_OK, shell.stderr
            assert shell.stdout.strip() == "on-the-node"
            said = " ".join(shell.stderr.split())
            assert f"moved from 127.0.0.1:{stale} to 127.0.0.1:{real_port} (GetNode)" in said
            assert "may have deleted itself" not in said
            assert _state("moved")["ssh_port"] == real_port  # saved for the next command

            _move_in_state("moved", stale)
            ran = tpulab(
                "exec", "moved", "--workdir", str(_workspace(tmp_path)),
                "--out", str(tmp_path / "out"), "--", "python", "hello.py", timeout=300,
            )  # fmt: skip
            assert ran.returncode == EXIT_OK, ran.stderr + ran.stdout
            assert "hello from the moved node" in ran.stdout
            assert _state("moved")["ssh_port"] == real_port
        down = tpulab("down", "moved", timeout=120)
        assert down.returncode == EXIT_OK, down.stderr
        assert emulator.node_names(PROJECT) == []


def test_after_an_emulator_restart_the_new_address_is_used_and_the_pin_still_holds(
    backend: EmbeddedHostBackend, tmp_path: Path
) -> None:
    """The restarted emulator serves the node on a new port, with a new host key (the
    emulator regenerates them): the new address is found, and the login is refused
    there, because the key is not the one `up` pinned."""
    state_dir = tmp_path / "emulator"
    first = Emulator(state_dir, host_backend=backend, timing=QUICK)
    url = first.start()
    try:
        before = _up(url, "pinned")
    finally:
        first.stop()
    http_port = int(url.rsplit(":", 1)[1])
    with Emulator(state_dir, host_backend=backend, timing=QUICK, port=http_port) as restarted:
        assert restarted.url == url  # the session's API endpoint still answers
        shell = tpulab("ssh", "pinned", "--", "true", timeout=120)
        assert shell.returncode == EXIT_REMOTE, shell.stderr
        said = " ".join(shell.stderr.split())
        assert f"moved from 127.0.0.1:{before['ssh_port']} to 127.0.0.1:" in said
        assert "does not present the host key `up` pinned" in said
        assert "may have deleted itself" not in said
        moved_to = _state("pinned")["ssh_port"]
        assert moved_to != before["ssh_port"]  # the API's address, kept

        _move_in_state("pinned", int(str(before["ssh_port"])))
        ran = tpulab(
            "exec", "pinned", "--workdir", str(_workspace(tmp_path)),
            "--out", str(tmp_path / "out"), "--", "python", "hello.py", timeout=300,
        )  # fmt: skip
        assert ran.returncode == EXIT_REMOTE, ran.stderr + ran.stdout
        assert "host key" in ran.stderr.lower()
        assert "hello from the moved node" not in ran.stdout
        down = tpulab("down", "pinned", timeout=120)
        assert down.returncode == EXIT_OK, down.stderr
        assert restarted.node_names(PROJECT) == []
