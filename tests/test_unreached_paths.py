"""Exit paths no other test reaches (issue 23, item 7), each broken at that exact point
by a real process and a real fault, then checked against the emulator for leftovers.

- `tpulab up` between keeping its node and recording it in session.json: a SIGTERM
  there must not leave a kept node that no session file names. The save is held open
  by a FIFO at the path `SessionStore.save` writes first (its `session.tmp`): opening a
  FIFO for writing blocks until a reader comes, so the test signals while `up` is
  provably inside the window (the kernel says the process waits for the FIFO's
  partner), never after a sleep.
- `tpulab run` whose teardown fails unexpectedly: the emulator answers the DeleteNode
  with a body the client cannot parse (`garbled_deletes`), an exception no teardown
  step expects. The run must say the node may be left and name it, exit
  EXIT_TEARDOWN, keep its journal row open, and `teardown --verify` must then delete
  the node.
- A run driven through `tpulab.run.lifecycle.Lifecycle` directly (the library's finer
  control, without the CLI's signal guard) whose user presses Ctrl-C again and again
  during teardown: each KeyboardInterrupt cuts a teardown short and it starts again,
  until the third, when the run gives up with "teardown was interrupted repeatedly".
  The delete operation hangs (`delete_hangs`), so each press lands in a teardown the
  test has seen running (its API requests after the previous press).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import served_emulator, tpulab, wait_until

from tpulab.cleanup.journal import Journal
from tpulab.emulator import Emulator
from tpulab.exits import EXIT_TEARDOWN

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


def test_a_teardown_that_fails_unexpectedly_leaves_an_open_row_the_sweep_finishes(
    served: Emulator, tpulab_home: Path
) -> None:
    served.faults.update({"garbled_deletes": 1})
    run = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", served.url,
        "--project", PROJECT, "--zone", ZONE, "--name", "garbled", "--boot-timeout", "30",
        timeout=300,
    )  # fmt: skip
    assert run.returncode == EXIT_TEARDOWN, run.stderr
    assert "teardown failed unexpectedly" in run.stderr, run.stderr
    assert "garbled" in run.stderr
    assert "gcloud compute tpus tpu-vm delete garbled" in run.stderr, run.stderr
    assert served.node_names(PROJECT) == ["garbled"]  # left, as the run said
    (row,) = Journal().open_runs()
    assert (row.node_name, row.teardown) == ("garbled", "unconfirmed")

    sweep = tpulab(
        "teardown", "--verify", "--yes", "--api-endpoint", served.url,
        "--project", PROJECT, "--zone", ZONE,
        timeout=300,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    assert served.node_names(PROJECT) == []
    assert Journal().open_runs() == []


# A library caller's script: the Lifecycle over the real client, its journal row kept as
# the CLI keeps it, and the run's TeardownError turned into the exit status the CLI
# documents for it (tpulab.exits).
_DRIVER = """
    import sys
    from tpulab.cleanup.journal import RunJournalAdapter
    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.config import TargetFlags, build_run_spec
    from tpulab.errors import TeardownError
    from tpulab.exits import exit_status_for
    from tpulab.run.lifecycle import Lifecycle

    url, project, zone, name = sys.argv[1:5]
    target = TargetFlags(
        accelerator="v5litepod-4", api_endpoint=url, project=project, zone=zone, name=name
    )
    spec = build_run_spec(target=target, env={})
    api = GoogleTpuApi(project, api_endpoint=url)
    life = Lifecycle(spec, api=api, journal=RunJournalAdapter(), teardown_poll=0.2)
    try:
        life.run()
    except TeardownError as error:
        print(error.message, file=sys.stderr)
        print(", ".join(node.name for node in error.leaked), file=sys.stderr)
        print(error.hint, file=sys.stderr)
        sys.exit(exit_status_for(error))
"""


def _controller_requests(emulator: Emulator) -> list[str]:
    """What the controller sent ("METHOD path"), not the node's own watchdog."""
    return [f"{r['method']} {r['path']}" for r in emulator.requests() if "caller" not in r]


def _asks_again(emulator: Emulator, run: subprocess.Popen[str], seen: int) -> Callable[[], bool]:
    """True once the controller sent two more requests than `seen` (or ended)."""
    return lambda: len(_controller_requests(emulator)) >= seen + 2 or run.poll() is not None


def test_a_teardown_interrupted_again_and_again_gives_up_and_the_sweep_finishes(
    served: Emulator, tpulab_home: Path, tmp_path: Path
) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(_DRIVER))
    served.faults.update({"delete_hangs": True})
    run = subprocess.Popen(
        [sys.executable, str(driver), served.url, PROJECT, ZONE, "again"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: (
                any(r.startswith("DELETE ") for r in _controller_requests(served))
                or run.poll() is not None
            ),
            timeout=300,
            what="the run's teardown to send its DeleteNode",
        )
        for _press in range(3):
            assert run.poll() is None, run.communicate()
            # The teardown is running (it asks the API again) before each press.
            wait_until(
                _asks_again(served, run, len(_controller_requests(served))),
                timeout=60,
                what="the teardown to be asking the API",
            )
            run.send_signal(signal.SIGINT)
        _out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == EXIT_TEARDOWN, err
    assert "teardown was interrupted repeatedly" in err, err
    assert "gcloud compute tpus tpu-vm delete again" in err, err
    assert served.node_names(PROJECT) == ["again"]  # left, as the run said
    (row,) = Journal().open_runs()
    assert (row.node_name, row.teardown) == ("again", "unconfirmed")

    served.faults.update({"delete_hangs": False})
    sweep = tpulab(
        "teardown", "--verify", "--yes", "--api-endpoint", served.url,
        "--project", PROJECT, "--zone", ZONE,
        timeout=300,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    assert served.node_names(PROJECT) == []
    assert Journal().open_runs() == []
