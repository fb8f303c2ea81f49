"""Exit paths no other test reaches (issue 23, item 7), each broken at that exact point
by a real process and a real fault, then checked against the emulator for leftovers.

- `tpulab up` between keeping its node and recording it in session.json: a SIGTERM
  there must not leave a kept node that no session file names. The save is held open
  by a FIFO at the path `SessionStore.save` writes first (its `session.tmp`): opening a
  FIFO for writing blocks until a reader comes, so the test signals while `up` is
  provably inside the window (the kernel says the process waits for the FIFO's
  partner), never after a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import served_emulator, tpulab, wait_until

from tpulab.emulator import Emulator

pytestmark = pytest.mark.slow

PROJECT = "unreached-proj"
ZONE = "us-central1-a"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def _blocked_opening_a_fifo(pid: int) -> bool:
    """Whether the process sleeps in the kernel's FIFO open (waiting for a reader)."""
    try:
        waiting = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
    return waiting in {"wait_for_partner", "fifo_open"}


def test_a_sigterm_between_keeping_and_recording_a_session_leaves_no_unrecorded_node(
    served: Emulator, tpulab_home: Path
) -> None:
    session = tpulab_home / "state" / "sessions" / "handover"
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tpulab",
            "up",
            "--accelerator",
            "v5litepod-4",
            "--api-endpoint",
            served.url,
            "--project",
            PROJECT,
            "--zone",
            ZONE,
            "--boot-timeout",
            "30",
            "--name",
            "handover",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        # `reserve` writes the key before the node exists; then the FIFO takes the
        # place of the state file's temporary, which the save opens after the hand-over.
        wait_until(lambda: (session / "key").exists(), timeout=60, what="the session's key")
        os.mkfifo(session / "session.tmp")
        wait_until(
            lambda: _blocked_opening_a_fifo(up.pid) or up.poll() is not None,
            timeout=300,
            what="up to reach the save of session.json",
        )
        assert up.poll() is None, up.communicate()
        # The node is kept and not yet recorded: exactly the window.
        assert served.node_names(PROJECT) != []
        up.send_signal(signal.SIGTERM)
        _out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    recorded = (session / "session.json").is_file()
    if recorded:
        # The session got recorded after all: then `down` must find and remove the node.
        down = tpulab("down", "handover", timeout=180)
        assert down.returncode == 0, down.stderr
    else:
        # Not recorded: `up` must have deleted the node itself, and said so.
        assert up.returncode != 0
        assert up.returncode != -signal.SIGTERM, "up was killed with its node kept"
        assert not session.exists(), err
    assert served.node_names(PROJECT) == [], err
