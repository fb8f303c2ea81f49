"""A session's node found gone, and sessions in `teardown --verify`: the core pieces
(tpulab.cleanup.sessions, tpulab.cleanup.sweep) against the emulator through the real
Google client, with a real journal and session store on disk. The end-to-end paths
(real `up`, OpenSSH, the watchdog) are in tests/test_sessions.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers import ACCELERATOR, ZONE, killed_run, tpulab
from pty_screen import answer_prompts

from tpulab.cleanup.journal import VANISHED, Journal, target_for
from tpulab.cleanup.report import TeardownEnvelope
from tpulab.cleanup.sessions import (
    SessionStore,
    ask_gone,
    conclude_gone,
    estimated_cost,
    reconcile_listed,
    why_gone,
)
from tpulab.cleanup.sweep import SweepPlan, SweepResult, find_orphans, sweep
from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing
from tpulab.errors import StateFileError
from tpulab.exits import EXIT_LOCAL_STATE, exit_status_for
from tpulab.run.session_state import SessionState

PROJECT = "gone-proj"
T0 = 1_800_000_000.0  # an epoch second in 2027: the session's times, fixed


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emulator", timing=Timing.fast()) as emu:
        yield emu


@pytest.fixture
def api(emulator: Emulator) -> GoogleTpuApi:
    return GoogleTpuApi(PROJECT, api_endpoint=emulator.url)


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.sqlite3")


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def _state(
    name: str,
    run_id: str,
    *,
    api_endpoint: str | None = None,
    started: float = T0,
    ttl: float = 7200.0,
    idle: float = 1800.0,
    renewed: float | None = None,
    spot: bool = False,
) -> SessionState:
    return SessionState(
        name=name,
        run_id=run_id,
        node_name=f"tpulab-{run_id}",
        zone=ZONE,
        project=PROJECT,
        api_endpoint=api_endpoint,
        accelerator_type=ACCELERATOR,
        spot=spot,
        ssh_user="tpulab",
        ssh_host="127.0.0.1",
        ssh_port=2222,
        host_key_type="ssh-ed25519",
        host_key_b64="AAAA",
        watchdog={
            "run_id": run_id,
            "node_name": f"tpulab-{run_id}",
            "zone": ZONE,
            "project": PROJECT,
            "lease_seconds": idle,
            "boot_grace_seconds": 300.0,
            "max_duration_seconds": ttl,
        },
        started_at=started,
        deadline_at=started + ttl,
        idle_seconds=idle,
        renewed_at=started if renewed is None else renewed,
    )


def _kept(store: SessionStore, state: SessionState) -> Path:
    key = store.reserve(state.name, b"private key")
    store.save(state)
    return key


def test_a_state_the_disk_refuses_is_a_state_file_error_and_leaves_no_half_file(
    tmp_path: Path,
) -> None:
    """A disk that refuses session.json (here: its name taken by a directory, so the
    rename fails as a full disk's write would) is StateFileError, exit 8, naming the
    file; `up` deletes the node it cannot record (cli/session.py). It was a bare OSError:
    a traceback, after that deletion."""
    store = SessionStore(tmp_path / "sessions")
    state = _state("s", "r1", ttl=7200.0, idle=1800.0)
    store.reserve(state.name, b"private key")
    blocked = store.root / "s" / "session.json"
    blocked.mkdir()
    with pytest.raises(StateFileError) as caught:
        store.save(state)
    assert f"Cannot write session s's state {blocked}: Is a directory." == caught.value.message
    assert "TPULAB_HOME" in (caught.value.hint or "")
    assert exit_status_for(caught.value) == EXIT_LOCAL_STATE
    assert sorted(p.name for p in (store.root / "s").iterdir()) == ["key", "session.json"]


def test_why_gone_tells_ttl_idle_and_someone_else_apart() -> None:
    state = _state("s", "r1", ttl=7200.0, idle=1800.0, renewed=T0 + 600)
    early = why_gone(state, now=T0 + 60)
    assert early.cause == "deleted"
    assert early.since is None
    assert "someone else" in early.reason
    idle = why_gone(state, now=T0 + 600 + 1800)
    assert (idle.cause, idle.since) == ("idle", T0 + 2400)
    assert idle.reason == "deleted itself: idle for 30 min (--idle)"
    # Both passed: the earlier one deleted it.
    assert why_gone(state, now=T0 + 7200).cause == "idle"
    renewed_late = _state("s", "r1", ttl=7200.0, idle=1800.0, renewed=T0 + 6000)
    ttl = why_gone(renewed_late, now=T0 + 7300)
    assert (ttl.cause, ttl.since) == ("ttl", T0 + 7200)
    assert ttl.reason == "deleted itself: its hard deadline passed (--ttl 2 h)"


def test_ask_gone_asks_the_api_and_conclude_gone_cleans_up_once(
    api: GoogleTpuApi, journal: Journal, store: SessionStore
) -> None:
    node = killed_run(api, "sess-1", journal=journal, phase="session")
    opened = journal.get("sess-1")
    assert opened is not None
    started = opened.started.timestamp()
    state = _state("lesson", "sess-1", api_endpoint=api.api_endpoint, idle=10.0, started=started)
    key = _kept(store, state)
    # The node is there: nothing may be concluded, whatever the clock says.
    assert ask_gone(api, state, now=lambda: started + 3600) is None
    api.wait_operation(api.delete_node(ZONE, node), timeout=30)
    vanish = ask_gone(api, state, now=lambda: started + 20)
    assert vanish is not None
    assert vanish.cause == "idle"

    concluded = conclude_gone(
        store, state, vanish, seen_by="a test", journal=journal, now=lambda: started + 20
    )
    assert concluded.journal_closed
    assert not key.exists()
    assert not store.exists("lesson")
    row = journal.get("sess-1")
    assert row is not None
    assert row.teardown == "confirmed"
    assert row.detail.startswith(f"{VANISHED}: session lesson's node deleted itself: idle for 10")
    assert "(a test)" in row.detail
    # Billed to the idle expiry (the earliest it can have gone), not to "now".
    assert row.ended == datetime.fromtimestamp(started + 10.0, timezone.utc)
    assert "session lesson's node" in concluded.message
    error = concluded.error()
    assert "deleted itself: idle for 10 s (--idle)" in error.message
    # Idempotent: a second look (another command) leaves the closed row as it was.
    again = conclude_gone(store, state, vanish, seen_by="another", journal=journal)
    assert not again.journal_closed
    assert journal.get("sess-1") == row


def test_reconcile_listed_concludes_only_sessions_the_listing_covers(
    journal: Journal, store: SessionStore
) -> None:
    here = "http://127.0.0.1:9/"
    gone = _state("gone", "r-gone", api_endpoint=here)
    shown = _state("shown", "r-shown", api_endpoint=here)
    elsewhere = _state("elsewhere", "r-else", api_endpoint="http://127.0.0.1:10")
    for state in (gone, shown, elsewhere):
        _kept(store, state)
    up, concluded = reconcile_listed(
        store,
        target=target_for(here),
        project=PROJECT,
        zones=[ZONE],
        listed={(ZONE, shown.node_name)},
        seen_by="tpulab list",
        journal=journal,
        now=lambda: T0 + 60,
    )
    assert [files.state.name for files in up] == ["elsewhere", "shown"]
    assert [(c.name, c.vanish.cause) for c in concluded] == [("gone", "deleted")]
    assert store.names() == ["elsewhere", "shown"]


def test_a_sessions_cost_so_far_is_spot_aware() -> None:
    on_demand = estimated_cost(_state("a", "r"), now=T0 + 3600)
    spot = estimated_cost(_state("a", "r", spot=True), now=T0 + 3600)
    assert on_demand is not None
    assert spot is not None
    assert 0 < spot < on_demand
    assert estimated_cost(_state("a", "r"), now=T0 - 10) == 0.0


def _sleep(seconds: float) -> None:
    time.sleep(min(seconds, 0.05))


def test_teardown_keeps_a_live_session_and_sweeps_the_rest(
    api: GoogleTpuApi, journal: Journal, store: SessionStore, emulator: Emulator
) -> None:
    now = time.time()
    session_node = killed_run(api, "sess-live", journal=journal, phase="session")
    live = _state("live", "sess-live", api_endpoint=api.api_endpoint, started=now - 60)
    _kept(store, live)
    # A session past its --ttl whose node is still listed: an orphan like any other.
    expired_node = killed_run(api, "sess-old", journal=journal, phase="session")
    expired = _state("old", "sess-old", api_endpoint=api.api_endpoint, started=now - 7300)
    expired_key = _kept(store, expired)
    orphan = killed_run(api, "crashed", journal=journal)
    # A session whose node already went: its row is closed as vanished, its key removed.
    killed_run(api, "sess-gone", journal=journal, phase="session", create=False)
    gone = _state("went", "sess-gone", api_endpoint=api.api_endpoint, started=now - 60)
    gone_key = _kept(store, gone)

    def plan_and_sweep(*, include_sessions: bool) -> tuple[SweepPlan, SweepResult]:
        plan = find_orphans(
            api,
            target=target_for(api.api_endpoint),
            zones=[ZONE],
            journal=journal,
            include_sessions=include_sessions,
            sessions=store,
            list_for=2.0,
            sleep=_sleep,
        )
        result = sweep(
            api, plan, journal=journal, sessions=store, timeout=20, poll=0.05, sleep=_sleep
        )
        return plan, result

    plan, result = plan_and_sweep(include_sessions=False)
    assert [(c.node.name, c.session) for c in plan.sessions] == [(session_node, "live")]
    assert sorted(c.node.name for c in plan.candidates) == sorted([expired_node, orphan])
    assert result.ok
    assert [n.name for n in result.kept_sessions] == [session_node]
    assert result.remaining == []
    assert sorted(result.ended_sessions) == ["old", "went"]
    assert emulator.node_names(PROJECT) == [session_node]
    assert not expired_key.exists()
    assert not gone_key.exists()
    assert store.names() == ["live"]
    went = journal.get("sess-gone")
    assert went is not None
    assert went.teardown == "confirmed"
    assert "session went's node was deleted by someone else" in went.detail
    assert {row.run_id for row in journal.open_runs()} == {"sess-live"}

    plan, result = plan_and_sweep(include_sessions=True)
    assert result.ok
    assert result.ended_sessions == ["live"]
    assert emulator.node_names(PROJECT) == []
    assert store.names() == []
    assert journal.open_runs() == []


def test_teardown_on_a_terminal_asks_apart_before_deleting_a_live_session(
    api: GoogleTpuApi, emulator: Emulator
) -> None:
    journal, store = Journal(), SessionStore()  # this test's TPULAB_HOME, as the CLI's
    session_node = killed_run(api, "sess-tty", journal=journal, phase="session")
    key = _kept(
        store, _state("tty", "sess-tty", api_endpoint=api.api_endpoint, started=time.time())
    )
    orphan = killed_run(api, "crashed-tty", journal=journal)
    args = ["teardown", "--verify", "--api-endpoint", api.api_endpoint or "", "--project", PROJECT]
    args += ["--zone", ZONE]
    # No to the session, yes to the rest: only the orphan goes.
    status, screen = answer_prompts(args, ["n", "y"])
    assert status == 0, screen
    assert "Also delete 1 live session(s) (tty)? [y/N]" in screen
    assert "Delete 1 node(s)? [y/N]" in screen
    assert f"Deleted and confirmed gone: {orphan}" in screen
    assert "Kept session tty" in screen
    assert emulator.node_names(PROJECT) == [session_node]
    assert key.exists()
    # Yes to the session too: its node, key and state go.
    status, screen = answer_prompts(args, ["y", "y"])
    assert status == 0, screen
    assert f"Deleted and confirmed gone: {session_node}" in screen
    assert emulator.node_names(PROJECT) == []
    assert not key.exists()
    assert journal.open_runs() == []


def test_teardown_keeps_two_live_sessions_under_yes_and_deletes_both_when_included(
    api: GoogleTpuApi, emulator: Emulator
) -> None:
    # Two sessions as `up` leaves them (journal row in phase "session", state and key
    # here, labelled node); the CLI is a real subprocess against the served emulator.
    journal, store = Journal(), SessionStore()
    nodes = {}
    for name in ("s1", "s2"):
        nodes[name] = killed_run(api, f"sess-{name}", journal=journal, phase="session")
        state = _state(name, f"sess-{name}", api_endpoint=api.api_endpoint, started=time.time())
        _kept(store, state)
    where = ["--api-endpoint", api.api_endpoint or "", "--project", PROJECT, "--zone", ZONE]
    kept = tpulab("teardown", "--verify", "--yes", *where, timeout=120)
    assert kept.returncode == 0, kept.stderr + kept.stdout
    assert "Kept session s1 (node tpulab-sess-s1): `tpulab down s1` or --include-sessions." in (
        kept.stdout
    )
    assert "Kept session s2" in kept.stdout
    assert "only the 2 kept session node(s) remain" in kept.stdout
    assert emulator.node_names(PROJECT) == sorted(nodes.values())
    assert store.names() == ["s1", "s2"]

    planned = tpulab("teardown", "--verify", "--dry-run", "--json", *where, timeout=120)
    assert planned.returncode == 0, planned.stderr
    document = TeardownEnvelope.model_validate_json(planned.stdout)
    assert sorted((f.name, f.session) for f in document.found) == sorted(
        (node, name) for name, node in nodes.items()
    )
    assert document.kept_sessions == ["s1", "s2"]
    assert document.deleted == []

    swept = tpulab("teardown", "--verify", "--yes", "--include-sessions", *where, timeout=120)
    assert swept.returncode == 0, swept.stderr + swept.stdout
    assert "Sessions ended (node gone; key and state removed): " in swept.stdout
    assert emulator.node_names(PROJECT) == []
    assert store.names() == []
    assert journal.open_runs() == []


def test_the_library_sweep_keeps_a_live_session_unless_told_to_include_it(
    api: GoogleTpuApi, emulator: Emulator
) -> None:
    import tpulab

    journal, store = Journal(), SessionStore()
    node = killed_run(api, "sess-lib", journal=journal, phase="session")
    _kept(store, _state("lib", "sess-lib", api_endpoint=api.api_endpoint, started=time.time()))
    endpoint = api.api_endpoint

    kept = tpulab.sweep(api_endpoint=endpoint, project=PROJECT, zones=[ZONE])
    assert kept.kept_sessions == ["lib"]
    assert emulator.node_names(PROJECT) == [node]
    assert store.names() == ["lib"]

    swept = tpulab.sweep(
        api_endpoint=endpoint, project=PROJECT, zones=[ZONE], include_sessions=True
    )
    assert swept.kept_sessions == []
    assert [found.name for found in swept.found] == [node]
    assert emulator.node_names(PROJECT) == []
    assert store.names() == []
