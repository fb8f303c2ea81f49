"""An endpoint that cannot be reached at all fails in seconds, clearly, and creates nothing.

Three kinds of dead endpoint, each a real one: a closed loopback port (connection
refused), a real server that accepts and never answers (blackhole), and a name under
`.invalid` (RFC 6761: never resolves). Retries are counted through the injected clock
and sleep, never timed with a stopwatch. And the invariant that bounds all of it
(DESIGN §3.3): an endpoint that answered once and is then lost -- after the node was
created -- is NOT given up on early; the run's teardown keeps trying to its deadline
and then says the node may still be billing and how to finish.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import Blackhole, FakeClock, refused_port

from tpulab.cleanup.journal import Journal, RunJournalAdapter
from tpulab.cleanup.sessions import SessionStore
from tpulab.cloud.google import GoogleTpuApi
from tpulab.cloud.reach import CLOUD_SCHEDULE, ReachSchedule
from tpulab.emulator import Emulator
from tpulab.errors import (
    EndpointDownError,
    EndpointSilentError,
    EndpointUnreachableError,
    OutcomeUnknownError,
    TeardownError,
    UnreachableError,
)
from tpulab.run.lifecycle import Lifecycle
from tpulab.run.progress import NullObserver, Phase
from tpulab.run.session_state import SessionState
from tpulab.run.teardown import delete_and_confirm

if TYPE_CHECKING:
    from collections.abc import Iterator

    from emulator_fixtures import EmulatorStarter
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

PROJECT = "test-project"
ZONE = "us-central1-a"
# A session's whole watchdog (one without it is a damaged state file, set aside).
WATCHDOG = {
    "run_id": "sess-1", "node_name": "tpulab-sess-1", "zone": ZONE, "project": PROJECT,
    "lease_seconds": 600.0, "boot_grace_seconds": 300.0, "max_duration_seconds": 3600.0,
}  # fmt: skip
UNRESOLVABLE = "http://tpu-nowhere.invalid:8470"


@pytest.fixture
def refused_url() -> Iterator[str]:
    """An endpoint that refuses every connection for the whole test: its port stays bound
    (never listening), so no other xdist worker's server can take it meanwhile."""
    with refused_port() as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    hole = Blackhole()
    try:
        yield hole
    finally:
        hole.close()


# -- the client: how long, how many tries, what it says ------------------------------


@pytest.mark.parametrize("where", ["refused", "unresolvable"])
def test_a_never_answering_endpoint_is_retried_on_the_schedule_then_declared_down(
    where: str, refused_url: str
) -> None:
    url = refused_url if where == "refused" else UNRESOLVABLE
    clock, notices = FakeClock(now=1000.0), list[str]()
    api = GoogleTpuApi(
        PROJECT,
        api_endpoint=url,
        clock=clock,
        sleep=clock.sleep,
        reach=CLOUD_SCHEDULE,
        notify=notices.append,
    )
    with pytest.raises(EndpointUnreachableError) as caught:
        api.list_nodes(ZONE)
    # Five tries over the 15 s schedule, then down: not the 60 s retry budget.
    assert api.call_count == CLOUD_SCHEDULE.tries == 5
    assert clock.sleeps == list(CLOUD_SCHEDULE.delays)
    error = caught.value
    assert isinstance(error, UnreachableError)  # never sent: nothing can have happened
    assert f"cannot reach the Cloud TPU API at {url}" in error.message
    words = "Connection refused" if where == "refused" else "its host name could not be resolved"
    assert words in error.message
    assert "never sent" in error.message
    assert error.hint is not None
    assert "--api-endpoint" in error.hint
    assert "emulator serve" in error.hint
    # The user saw each retry coming, numbered.
    assert notices == [f"cannot reach {url} ({words}), retrying ({n} of 5)" for n in range(2, 6)]
    # Down is sticky: later calls of the command fail at once, unsent.
    with pytest.raises(EndpointDownError, match="not reachable"):
        api.get_node(ZONE, "anything")
    assert api.call_count == 5


def test_a_create_to_a_dead_endpoint_is_resent_only_because_it_was_never_sent(
    refused_url: str,
) -> None:
    clock = FakeClock(now=1000.0)
    url = refused_url
    api = GoogleTpuApi(
        PROJECT, api_endpoint=url, clock=clock, sleep=clock.sleep, reach=CLOUD_SCHEDULE
    )
    from tpulab.models import NodeRequest

    request = NodeRequest(accelerator_type="v5litepod-4", runtime_version="v2-alpha-tpuv5-lite")
    with pytest.raises(EndpointUnreachableError, match="never sent"):
        api.create_node(ZONE, "node-x", request)
    assert api.call_count == 5


def test_a_blackhole_is_declared_down_after_one_bounded_try(blackhole: Blackhole) -> None:
    # The listener takes the request and says nothing. The try's timeout is the reach
    # schedule's, not the 60 s request timeout, and an idempotent call is not then
    # retried for a minute: the endpoint never answered anything.
    api = GoogleTpuApi(PROJECT, api_endpoint=blackhole.url, reach=ReachSchedule((), min_try=0.5))
    with pytest.raises(EndpointSilentError) as caught:
        api.list_nodes(ZONE)
    assert isinstance(caught.value, OutcomeUnknownError)  # it was sent: say so honestly
    assert "accepted the connection but never answered" in caught.value.message
    assert api.call_count == 1
    assert blackhole.accepted == 1


def test_a_create_sent_to_a_blackhole_keeps_its_unknown_outcome(blackhole: Blackhole) -> None:
    # Sent and unanswered: a node may exist, so it is neither resent nor called down.
    from tpulab.models import NodeRequest

    api = GoogleTpuApi(PROJECT, api_endpoint=blackhole.url, reach=ReachSchedule((), min_try=0.5))
    request = NodeRequest(accelerator_type="v5litepod-4", runtime_version="v2-alpha-tpuv5-lite")
    with pytest.raises(OutcomeUnknownError) as caught:
        api.create_node(ZONE, "node-x", request)
    assert not isinstance(caught.value, EndpointDownError)
    assert api.call_count == 1


def test_an_endpoint_that_answered_once_is_never_declared_down(emulator: Emulator) -> None:
    # Losing a live endpoint is a blip to ride out (DESIGN §3.3), however long it lasts.
    clock = FakeClock(now=1000.0)
    api = GoogleTpuApi(
        PROJECT,
        api_endpoint=emulator.url,
        clock=clock,
        sleep=clock.sleep,
        reach=CLOUD_SCHEDULE,
        retry_for=30.0,
    )
    assert api.list_nodes(ZONE) == []
    emulator.stop()
    with pytest.raises(UnreachableError) as caught:
        api.list_nodes(ZONE)
    assert not isinstance(caught.value, EndpointDownError)


# -- the teardown: a dead endpoint ends it at once, a lost one does not -------------------


def test_teardown_against_a_dead_endpoint_stops_at_once_and_says_nothing_was_deleted(
    refused_url: str,
) -> None:
    clock = FakeClock(now=1000.0)
    api = GoogleTpuApi(
        PROJECT,
        api_endpoint=refused_url,
        clock=clock,
        sleep=clock.sleep,
        reach=CLOUD_SCHEDULE,
    )
    with pytest.raises(TeardownError) as caught:
        delete_and_confirm(
            api, ZONE, "node-x", run_id="r1", timeout=600.0, clock=clock, sleep=clock.sleep
        )
    # The reach schedule, not the 600 s teardown deadline.
    assert clock.now - 1000.0 == pytest.approx(CLOUD_SCHEDULE.budget)
    message = caught.value.message
    assert "cannot reach the Cloud TPU API" in message
    assert "nothing was deleted" in message
    assert "may exist and still be billing" in message
    assert caught.value.leaked
    assert caught.value.leaked[0].name == "node-x"


class StopTheApiAt(NullObserver):
    def __init__(self, rig: Rig, phase: Phase) -> None:
        self.rig, self.phase = rig, phase

    def phase_started(self, phase: Phase) -> None:
        if phase is self.phase:
            self.rig.emulator.stop()


def test_a_run_that_loses_its_endpoint_after_create_keeps_trying_and_the_journal_row(
    embedded_rig: Rig,
) -> None:
    # The node exists (the create answered); then the endpoint goes. The teardown must
    # try to its own deadline -- not stop at the reach schedule -- and then say the node
    # may still be billing, with the command that finishes it, the journal row kept.
    spec = embedded_rig.spec("v5litepod-1", ready=1.0, teardown=3.0)
    journal = Journal()
    life, _, error = embedded_rig.run(
        spec,
        StopTheApiAt(embedded_rig, Phase.WAIT_READY),
        journal=RunJournalAdapter(journal),
    )
    assert isinstance(error, TeardownError), repr(error)
    assert "cannot reach the Cloud TPU API" not in error.message  # not given up early
    assert "Teardown NOT confirmed after" in error.message
    assert "billing" in error.message
    assert error.hint is not None
    assert "tpulab teardown --verify" in error.hint
    assert life.outcome.teardown_status != "confirmed"
    row = journal.get(spec.run_id)
    assert row is not None
    assert row.needs_teardown
    assert spec.run_id in [r.run_id for r in journal.open_runs()]


def test_a_run_against_a_dead_endpoint_creates_nothing_and_closes_its_row(
    embedded_rig: Rig,
) -> None:
    spec = embedded_rig.spec("v5litepod-4")
    journal = Journal()
    clock = FakeClock(now=1000.0)
    api = GoogleTpuApi(
        spec.project.value,
        api_endpoint=UNRESOLVABLE,
        clock=clock,
        sleep=clock.sleep,
        reach=CLOUD_SCHEDULE,
    )
    life = Lifecycle(spec, api=api, journal=RunJournalAdapter(journal), teardown_poll=0.05)
    with pytest.raises(EndpointUnreachableError, match="never sent"):
        life.run()
    assert api.call_count == 5
    assert life.outcome.teardown_status == "not-created"
    assert journal.open_runs() == []
    assert embedded_rig.leftovers() == []


# -- the commands, as the user runs them -------------------------------------------------


def _tpulab(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TPULAB_HOME": str(home), "NO_GCE_CHECK": "True"}
    # No stopwatch: the old code took 2.5 min (teardown) to 10 min (a run's teardown);
    # a guard far below that and far above a loaded machine's import time tells them apart.
    return subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.parametrize("where", ["refused", "blackhole", "unresolvable"])
def test_tpulab_list_against_a_dead_endpoint_exits_3_with_what_to_do(
    tpulab_home: Path, blackhole: Blackhole, where: str, refused_url: str
) -> None:
    url, words = {
        "refused": (refused_url, "Connection refused"),
        "blackhole": (blackhole.url, "it accepted the connection but never answered"),
        "unresolvable": (UNRESOLVABLE, "its host name could not be resolved"),
    }[where]
    done = _tpulab(
        "list", "--api-endpoint", url, "--project", PROJECT, "--zone", ZONE, home=tpulab_home
    )
    assert done.returncode == 3, done.stderr
    assert f"cannot reach the Cloud TPU API at {url} ({words}" in done.stderr
    assert "tpulab emulator serve" in done.stderr
    if where == "unresolvable":  # not loopback: retried for a network blip, and said so
        assert f"cannot reach {url} ({words}), retrying (2 of 5)" in done.stderr


def test_teardown_verify_against_a_dead_endpoint_exits_6_and_keeps_the_journal(
    tpulab_home: Path, start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    # Runs killed against a served emulator that was then stopped: their rows are open,
    # their nodes may exist, and nothing answers there any more.
    from emulator_fixtures import api_for
    from helpers import killed_run

    emulator = start_emulator(tmp_path / "served")
    for run_id in ("dead-1", "dead-2"):
        killed_run(api_for(emulator), run_id)
    emulator.stop()
    url = emulator.url
    before = sorted(r.run_id for r in Journal().open_runs())
    # Hold the stopped emulator's port (bound, never listening), as refused_port does, so
    # no other xdist worker's server can take it and answer in its place.
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        done = _tpulab(
            "teardown", "--verify", "--yes", "--api-endpoint", url, "--project", PROJECT,
            "--zone", ZONE, home=tpulab_home,
        )  # fmt: skip
    assert done.returncode == 6, done.stderr
    out = done.stdout + done.stderr
    assert f"cannot reach the Cloud TPU API at {url}" in out
    assert "Nothing was deleted" in out
    assert "The journal still holds 2 run(s) (dead-1, dead-2)" in out
    assert f"tpulab teardown --verify --api-endpoint {url}` again" in out
    assert sorted(r.run_id for r in Journal().open_runs()) == before == ["dead-1", "dead-2"]


def test_down_against_a_dead_endpoint_exits_6_keeps_the_session_and_says_how_to_finish(
    tpulab_home: Path, refused_url: str
) -> None:
    url = refused_url
    store = SessionStore()
    store.reserve("lesson", b"not a real key")
    now = time.time()
    store.save(
        SessionState(
            name="lesson", run_id="sess-1", node_name="tpulab-sess-1", zone=ZONE,
            project=PROJECT, api_endpoint=url, accelerator_type="v5litepod-4", spot=False,
            ssh_user="u", ssh_host="127.0.0.1", ssh_port=22, host_key_type="ssh-ed25519",
            host_key_b64="AAAA", watchdog=WATCHDOG, started_at=now, deadline_at=now + 3600,
            idle_seconds=600, renewed_at=now,
        )
    )  # fmt: skip
    done = _tpulab("down", "lesson", home=tpulab_home)
    assert done.returncode == 6, done.stderr
    # `down` first looks for a running exec and for the node: the first call that finds
    # the endpoint down says "cannot reach ...", later ones "... is not reachable".
    assert f"the Cloud TPU API at {url}" in done.stderr
    assert "cannot reach" in done.stderr or "is not reachable" in done.stderr
    assert "nothing was deleted" in done.stderr
    assert "tpulab down lesson" in done.stderr
    assert store.exists("lesson")  # kept: `tpulab down lesson` can be run again
