"""The lease renewer over a real SSH connection (both host backends): it shares the
run's Connection with a running command, stops for good before the session closes, and
notes failures instead of raising them.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import FakeClock

from tpulab.remote.watchdog import WatchdogConfig
from tpulab.run.lease import LeaseRenewer

if TYPE_CHECKING:
    from ssh_fixtures import SshHost

pytest_plugins = ["ssh_fixtures"]


def _config() -> WatchdogConfig:
    return WatchdogConfig(
        run_id=f"20261201t130000-{uuid.uuid4().hex[:6]}",
        node_name="tpulab-lease-test",
        zone="us-central1-a",
        project="p",
        lease_seconds=10.0,  # a renewal every 2 s
        boot_grace_seconds=60.0,
        max_duration_seconds=600.0,
    )


@pytest.fixture
def config() -> Iterator[WatchdogConfig]:
    made = _config()
    yield made
    for path in (Path(made.lease_path), Path(made.lease_path + ".tmp")):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _seq(config: WatchdogConfig) -> int:
    path = Path(config.lease_path)
    if not path.exists():
        return 0
    line = json.loads(path.read_text().splitlines()[-1])
    assert line["lease_seconds"] == config.lease_seconds
    return int(line["seq"])


# Waits (bounded: 60 s) until the lease file holds renewal 3 or later; the renewal
# writes it whole (`mv`), one JSON line with sorted keys.
_UNTIL_SEQ_3 = (
    'n=0; until grep -qE \'"seq": ([3-9]|[1-9][0-9]+)}\' "$1" 2>/dev/null; do '
    '[ "$n" -lt 600 ] || exit 1; n=$((n + 1)); sleep 0.1; done; echo done'
)


def test_renewals_share_the_connection_with_a_running_command(
    ssh_host: SshHost, config: WatchdogConfig
) -> None:
    notes: list[str] = []
    with ssh_host.connect() as session:
        renewer = LeaseRenewer(session, config, note=notes.append)
        renewer.start()
        assert _seq(config) == 1  # the first renewal is done before start() returns
        # The payload's long command runs on its own channel while the thread renews: it
        # ends once two background renewals went through (not after a fixed sleep, which
        # a loaded machine's slower renewals could outlast).
        result = session.run(
            ["sh", "-c", _UNTIL_SEQ_3, "until-seq-3", config.lease_path], timeout=90, check=True
        )
        assert result.stdout.strip() == "done"
        renewed = _seq(config)
        assert renewed >= 3, renewed  # the first, plus two from the thread
        renewer.stop()
        # stop() returns once no renewal can start: its thread has ended (no later one
        # can come from it), and a renewal asked for now is refused, not run.
        assert not any(t.name.startswith("tpulab-lease-") for t in threading.enumerate())
        after_stop = _seq(config)
        assert renewer.renew() is False
        assert _seq(config) == after_stop, "a renewal ran after stop()"
    assert renewer.failures == []
    assert notes == []
    assert renewer.renewals == after_stop


def test_a_failing_renewal_is_noted_not_raised_and_recovery_is_noted_too(
    ssh_host: SshHost, config: WatchdogConfig
) -> None:
    notes: list[str] = []
    blocker = Path(config.lease_path)
    blocker.mkdir()  # the renewal cannot replace the lease file
    (blocker / "inside").write_text("")  # nor remove it
    with ssh_host.connect() as session:
        renewer = LeaseRenewer(session, config, note=notes.append)
        renewer.start()  # does not raise
        assert renewer.renewals == 0
        assert len(renewer.failures) == 1
        assert len(notes) == 1
        assert "lease renewal failed" in notes[0]
        assert "the teardown still runs" in notes[0]
        time.sleep(config.renew_seconds * 1.5)
        assert len(notes) == 1, notes  # one note per failing stretch, not one per try
        (blocker / "inside").unlink()
        blocker.rmdir()
        deadline = time.monotonic() + 20
        while renewer.renewals == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        renewer.stop()
        assert renewer.renewals >= 1
        # The session is still usable: the failures never broke the connection.
        assert session.run(["true"], timeout=10).exit_status == 0
    assert notes[-1] == "lease renewals work again"
    assert _seq(config) >= 1


def test_lapsed_means_no_renewal_for_a_whole_lease(config: WatchdogConfig) -> None:
    class Refusing:
        """A session whose every command fails, as a dropped connection's do."""

        def run(self, argv: object, **_: object) -> object:
            from tpulab.errors import ConnectError

            raise ConnectError("The SSH connection dropped")

    clock = FakeClock()
    renewer = LeaseRenewer(Refusing(), config, background=False, clock=clock)
    renewer.start()
    assert renewer.lapsed()  # never renewed at all
    renewer.last_renewed = clock()
    clock.sleep(config.lease_seconds - 1)
    assert not renewer.lapsed()
    clock.sleep(1)
    assert renewer.lapsed()

    # A renewal after waking up does not hide that the lease lapsed while asleep.
    class Working:
        def run(self, argv: object, **_: object) -> object:
            return None

    awake = LeaseRenewer(Working(), config, background=False, clock=clock)
    awake.start()
    assert not awake.lapsed()
    clock.sleep(config.lease_seconds + 5)  # SIGSTOP
    awake.renew()  # SIGCONT: the first renewal goes through
    assert awake.lapsed()


def test_renewers_writing_at_once_all_succeed_and_leave_no_temporary_file(
    config: WatchdogConfig,
) -> None:
    """An emulated slice's four workers share one /tmp, and a forward renews beside an
    exec: renewals at the same moment must not fail on each other's temporary file."""
    import subprocess

    from tpulab.remote.watchdog import renew_command

    writers = [subprocess.Popen(renew_command(config, seq)) for seq in range(1, 33)]
    assert [w.wait(timeout=60) for w in writers] == [0] * 32
    assert 1 <= _seq(config) <= 32
    lease = Path(config.lease_path)
    assert list(lease.parent.glob(lease.name + ".tmp*")) == []


def test_stopping_renewers_stuck_on_a_dead_link_waits_once_for_them_all(
    config: WatchdogConfig,
) -> None:
    """The teardown's first step stops every worker's renewer. A renewal stuck
    reconnecting to a link that is down (each try may take 20 s) is not waited out,
    once per worker: the node's delete, which needs no SSH, waited 10 s per worker
    behind them (a Ctrl-C during an outage, by hand). All are told to stop first and
    waited for within one bound."""
    from tpulab.run.lease import stop_renewers

    link_back = threading.Event()
    entered = threading.Semaphore(0)

    class DeadLink:
        """A session whose command waits for a link that is down."""

        def __init__(self) -> None:
            self.calls = 0

        def run(self, argv: object, **_: object) -> object:
            self.calls += 1
            if self.calls > 1:  # the first renewal (start()) went through
                entered.release()
                link_back.wait(60)
            return None

    sessions = [DeadLink() for _ in range(4)]
    renewers = [LeaseRenewer(s, config) for s in sessions]
    try:
        for renewer in renewers:
            renewer.start()
        for _ in renewers:  # every renewer's background renewal is in flight, stuck
            assert entered.acquire(timeout=30)
        started = time.monotonic()
        stop_renewers(renewers, wait=2.0)
        took = time.monotonic() - started
        # Four stuck renewers, one 2 s bound for them all (each in turn: 8 s; the old
        # stop waited 2 x 5 s for each, 40 s).
        assert took < 5, took
        assert not link_back.is_set()  # they were left stuck, not waited out
    finally:
        link_back.set()
    # The link back, each stuck renewal ends and its thread with it: none renews again.
    for thread in threading.enumerate():
        if thread.name.startswith("tpulab-lease-"):
            thread.join(timeout=30)
    assert [s.calls for s in sessions] == [2, 2, 2, 2]
    assert all(r.renew() is False for r in renewers)
