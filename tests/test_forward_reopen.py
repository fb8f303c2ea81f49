"""`Forwarding.hold(..., reopen=)`: a forward alone whose ssh lost its connection (exit
255) is started again while the session's lease may hold and its node is there, and
not when that cannot help. "ssh" here is a stand-in process (the argv seam) that
listens on the forward's port, or exits 255 as a lost connection does, as each test
plans; the renewer is the real one over a session stand-in. The whole path against a
real sshd is in test_forward_e2e.py."""

from __future__ import annotations

import socket
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest
from helpers import FakeClock, wait_until

from tpulab.config.forward import Forward
from tpulab.remote.watchdog import WatchdogConfig
from tpulab.run.forward import SSH_CONNECTION_LOST, Forwarding
from tpulab.run.lease import LeaseRenewer

# Each start appends a line to STARTS, then does what the plan's line for that start
# says: "lost" exits 255 at once; "serve" listens on PORT until DROP exists (then exits
# 255: the connection lost) or STOP exists (exits 0: ssh ended as asked).
STAND_IN = """
import os, socket, sys, time
starts, port, drop, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
plan = sys.argv[5].split(",")
with open(starts, "a") as f:
    f.write("start\\n")
n = len(open(starts).read().splitlines())
if plan[min(n, len(plan)) - 1] == "lost":
    sys.exit(255)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
while True:
    if os.path.exists(drop):
        os.unlink(drop)
        sys.exit(255)
    if os.path.exists(stop):
        sys.exit(0)
    time.sleep(0.02)
"""


class Said:
    """The CLI's side of `Reopening`: what the forward said, and the node's fate."""

    def __init__(self, gone_after: int | None = None) -> None:
        self.notes: list[str] = []
        self.asked = 0
        self.gone_after = gone_after  # gone from this many asks on (None: never)

    def note(self, message: str) -> None:
        self.notes.append(message)

    def gone(self) -> bool:
        self.asked += 1
        return self.gone_after is not None and self.asked >= self.gone_after


class Works:
    """A session whose renewals go through: the link to the VM is up."""

    def run(self, argv: object, **_: object) -> object:
        return None


def renewer(clock: FakeClock | None = None) -> LeaseRenewer:
    config = WatchdogConfig(
        run_id=f"20261207t140000-{uuid.uuid4().hex[:6]}",
        node_name="tpulab-forward-test",
        zone="us-central1-a",
        project="p",
        lease_seconds=600.0,
        boot_grace_seconds=60.0,
        max_duration_seconds=3600.0,
    )
    made = LeaseRenewer(Works(), config, background=False, clock=clock or FakeClock())
    made.start()
    return made


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Rig:
    def __init__(self, tmp_path: Path, plan: str) -> None:
        self.port = free_port()
        self.starts, self.drop, self.stop = (tmp_path / n for n in ("starts", "drop", "stop"))
        script = tmp_path / "ssh_stand_in.py"
        script.write_text(textwrap.dedent(STAND_IN))
        argv = [sys.executable, str(script), str(self.starts), str(self.port), str(self.drop)]
        self.forwarding = Forwarding(
            [*argv, str(self.stop), plan], [Forward(port=self.port)], reopen_pause=0.01
        )

    def started(self) -> int:
        return len(self.starts.read_text().splitlines()) if self.starts.exists() else 0

    def listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False


def test_a_lost_forward_is_opened_again_on_its_port_and_held(tmp_path: Path) -> None:
    rig = Rig(tmp_path, "serve,serve")
    said = Said()
    rig.forwarding.start()
    rig.forwarding.wait_listening()
    result: list[int] = []
    holding = threading.Thread(
        target=lambda: result.append(rig.forwarding.hold(renewer(), reopen=said))
    )
    holding.start()
    rig.drop.write_text("")  # the connection is lost: ssh exits 255
    wait_until(lambda: "the forward is open again" in said.notes, "the reopen", timeout=60)
    assert rig.started() == 2
    assert rig.listening()
    rig.stop.write_text("")  # ssh ends as asked: hold returns its status
    holding.join(timeout=60)
    assert result == [0]
    assert said.notes == [
        "the forward's SSH connection was lost (ssh exit 255); reopening it",
        "the forward is open again",
    ]


def test_a_port_another_program_took_meanwhile_is_not_taken_for_the_forward(
    tmp_path: Path,
) -> None:
    """Once ssh is gone, what listens on the port is another program's: the forward
    would 'listen' at once and fail again, every few seconds, for as long as the lease."""
    rig = Rig(tmp_path, "lost")
    said = Said(gone_after=4)  # bounds a forward that would loop
    with socket.socket() as other:
        other.bind(("127.0.0.1", rig.port))
        other.listen()
        rig.forwarding.start()
        status = rig.forwarding.hold(renewer(), reopen=said)
    assert status == SSH_CONNECTION_LOST
    assert rig.started() == 1
    assert said.notes[-1] == (
        f"not reopened: port {rig.port} on this laptop is in use by another program now"
    )
    assert "the forward is open again" not in said.notes


def test_an_ssh_that_keeps_failing_while_the_vm_answers_is_given_up(tmp_path: Path) -> None:
    rig = Rig(tmp_path, "lost")
    said = Said()
    rig.forwarding.start()
    status = rig.forwarding.hold(renewer(), reopen=said)
    assert status == SSH_CONNECTION_LOST
    assert rig.started() == 4  # the first, and three tries
    assert said.notes[-1].startswith("not reopened: ssh keeps failing while the VM answers")


@pytest.mark.parametrize("why", ["lapsed", "gone"])
def test_nothing_is_reopened_past_the_lease_or_to_a_node_gone(tmp_path: Path, why: str) -> None:
    rig = Rig(tmp_path, "lost")
    said = Said(gone_after=1 if why == "gone" else None)
    clock = FakeClock()
    kept = renewer(clock)
    if why == "lapsed":
        clock.sleep(kept.config.lease_seconds)  # no renewal since: the VM deletes itself
    rig.forwarding.start()
    status = rig.forwarding.hold(kept, reopen=said)
    assert status == SSH_CONNECTION_LOST
    assert rig.started() == 1
    if why == "lapsed":
        assert said.notes[-1].startswith("not reopened: the session's lease may have lapsed")
    else:
        assert said.asked == 1
