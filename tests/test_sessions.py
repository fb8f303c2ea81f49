"""`tpulab up` / `ssh` / `down` as a user types them: real subprocesses against an
emulator served from this process (a session outlives the `up` process, so the
emulator must too), whose nodes are real SSH servers reached by the system's OpenSSH
client. Nothing is mocked; every test ends by asking the emulator what is left."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import tpulab

from tpulab.cleanup.journal import Journal
from tpulab.emulator import Emulator
from tpulab.emulator.hostenv import preloaded_image_env
from tpulab.emulator.sshhost import EmbeddedHostBackend
from tpulab.emulator.timing import Timing

pytestmark = pytest.mark.slow

PROJECT = "session-proj"
ZONE = "us-central1-a"
EXIT_OK = 0
EXIT_CONFIG = 2


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    state = tmp_path / "emulator"
    backend = EmbeddedHostBackend(state, image=preloaded_image_env())
    try:
        with Emulator(
            state, host_backend=backend, timing=Timing(create_seconds=0.3, delete_seconds=0.3)
        ) as emulator:
            yield emulator
    finally:
        backend.close()


def _up(emulator: Emulator, *extra: str) -> list[str]:
    return [
        "up", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        "--project", PROJECT, "--zone", ZONE, "--boot-timeout", "30", *extra,
    ]  # fmt: skip


def _sessions_dir(home: Path) -> Path:
    return home / "state" / "sessions"


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_up_ssh_down_leaves_nothing(served: Emulator, tpulab_home: Path) -> None:
    up = tpulab(*_up(served, "--name", "lesson-1", "--ttl", "1h", "--idle", "10m"), timeout=300)
    assert up.returncode == EXIT_OK, up.stderr + up.stdout
    assert "Session lesson-1 is up" in up.stdout
    # The node is kept, and the session's key is on disk, owner-only.
    (node,) = served.node_names(PROJECT)
    key = _sessions_dir(tpulab_home) / "lesson-1" / "key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    state = json.loads((key.parent / "session.json").read_text())
    assert state["node_name"] == node
    assert state["idle_seconds"] == 600.0
    assert state["deadline_at"] - state["started_at"] == 3600.0
    row = Journal().get(state["run_id"])
    assert row is not None
    assert row.teardown is None
    assert row.phase == "session"

    # The name may be omitted with exactly one session up; the command runs on the VM.
    shell = tpulab("ssh", "--", "echo", "ok", "from", "$(hostname)", timeout=60)
    assert shell.returncode == EXIT_OK, shell.stderr
    assert shell.stdout.startswith("ok from")
    renewed = json.loads((key.parent / "session.json").read_text())["renewed_at"]
    assert renewed > state["renewed_at"]
    # The remote command's own exit status comes back.
    failing = tpulab("ssh", "lesson-1", "--", "sh", "-c", "exit 7", timeout=60)
    assert failing.returncode == 7, failing.stderr

    where = ("--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE)
    listed = tpulab("list", *where, timeout=60)
    assert listed.returncode == EXIT_OK, listed.stderr
    (line,) = [row for row in listed.stdout.splitlines() if row.startswith("lesson-1 ")]
    assert node in line
    assert "v5litepod-4" in line
    assert "59m" in line or "58m" in line  # deadline in ~1h
    assert "9m" in line  # idle expiry ~10 min after the renewal

    down = tpulab("down", "lesson-1", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr + down.stdout
    assert "deleted, confirmed by list" in down.stdout
    assert served.node_names(PROJECT) == []
    assert not key.exists()
    assert not key.parent.exists()
    closed = Journal().get(state["run_id"])
    assert closed is not None
    assert closed.teardown == "confirmed"


def test_an_idle_session_deletes_itself_and_list_cleans_its_key(
    served: Emulator, tpulab_home: Path
) -> None:
    up = tpulab(*_up(served, "--name", "idle", "--idle", "10s"), timeout=300)
    assert up.returncode == EXIT_OK, up.stderr + up.stdout
    key = _sessions_dir(tpulab_home) / "idle" / "key"
    assert key.is_file()
    # Nobody renews the lease: the VM's watchdog deletes the node (10 s + its poll).
    deadline = time.monotonic() + 60
    while served.node_names(PROJECT):
        assert time.monotonic() < deadline, "the idle session's node was not deleted"
        time.sleep(0.5)
    where = ("--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE)
    listed = tpulab("list", *where, timeout=60)
    assert listed.returncode == EXIT_OK, listed.stderr
    assert "session idle: its node" in listed.stderr
    assert "is gone" in listed.stderr
    assert not key.exists()
    down = tpulab("down", "idle", timeout=60)
    assert down.returncode == EXIT_CONFIG
    assert "There is no session named 'idle'" in down.stderr


def test_a_failing_up_leaves_no_node_and_no_key(served: Emulator, tpulab_home: Path) -> None:
    # The node boots, SSH and the watchdog come up, then the verifier is killed before it
    # writes a receipt (it needs several seconds): the run's own teardown must delete
    # the node although `up` asked to keep it.
    up = tpulab(*_up(served, "--name", "broken", "--payload-timeout", "1"), timeout=300)
    assert up.returncode != EXIT_OK, up.stdout
    assert "verify_tpu.py" in up.stderr
    assert "was killed" in up.stderr
    assert "Delete VM and confirm" in up.stdout
    assert "confirmed by list" in up.stdout
    assert "Session broken is up" not in up.stdout
    methods = [entry["method"] for entry in served.requests()]
    assert "POST" in methods
    assert "DELETE" in methods
    assert served.node_names(PROJECT) == []
    assert _sessions_dir(tpulab_home).is_dir()
    assert list(_sessions_dir(tpulab_home).iterdir()) == []


def test_down_of_a_missing_session_is_a_clear_error(tpulab_home: Path) -> None:
    done = tpulab("down", "nosuch", timeout=60)
    assert done.returncode == EXIT_CONFIG
    assert "There is no session named 'nosuch'" in done.stderr
    alone = tpulab("ssh", timeout=60)
    assert alone.returncode == EXIT_CONFIG
    assert "No session is up" in alone.stderr


def test_a_ttl_over_a_day_is_refused_before_any_api_call(served: Emulator) -> None:
    done = tpulab(*_up(served, "--ttl", "25h"), timeout=60)
    assert done.returncode == EXIT_CONFIG
    assert "--ttl '25h' is out of range: a session lives at most 24 h" in done.stderr
    assert served.requests() == []


def test_two_sessions_down_one_touches_only_it(served: Emulator, tpulab_home: Path) -> None:
    for name in ("one", "two"):
        up = tpulab(*_up(served, "--name", name), timeout=300)
        assert up.returncode == EXIT_OK, up.stderr + up.stdout
    assert len(served.node_names(PROJECT)) == 2
    two = json.loads((_sessions_dir(tpulab_home) / "two" / "session.json").read_text())
    # With two up, the name may not be omitted.
    ambiguous = tpulab("ssh", "--", "true", timeout=60)
    assert ambiguous.returncode == EXIT_CONFIG
    assert "2 sessions are up (one, two): say which." in ambiguous.stderr
    # A second `up` with a name in use is refused before anything is created.
    before = len(served.requests())
    again = tpulab(*_up(served, "--name", "one"), timeout=60)
    assert again.returncode == EXIT_CONFIG
    assert "A session named 'one' already exists." in again.stderr
    assert len(served.requests()) == before

    down = tpulab("down", "one", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == [two["node_name"]]
    assert (_sessions_dir(tpulab_home) / "two" / "key").is_file()
    done = tpulab("down", "--all", timeout=120)
    assert done.returncode == EXIT_OK, done.stderr
    assert served.node_names(PROJECT) == []
    assert list(_sessions_dir(tpulab_home).iterdir()) == []
