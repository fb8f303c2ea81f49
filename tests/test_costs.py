"""`tpulab costs`: the ledger read from a real journal (SQLite under the test's TPULAB_HOME).

Real emulated runs fill it where that is cheap (rig: the emulator, its SSH hosts and the
real REST client); the edge cases (open, unconfirmed, not-created, two days, two types,
spot, an unknown type) are rows written through the Journal API with a chosen clock.
Expected figures are computed here from DESIGN §6's list prices, not read back from the
code: a changed price or cost rule fails these tests on purpose.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import invoke, refused_port

from tpulab import paths
from tpulab.catalog import PRICE_DATE
from tpulab.cleanup.costs import CostsEnvelope, Ledger, ledger
from tpulab.cleanup.journal import Journal, RunJournalAdapter, RunRow, TeardownResult
from tpulab.cleanup.sessions import SessionStore, conclude_gone, why_gone
from tpulab.cloud.google import GoogleTpuApi
from tpulab.config import costs_inputs
from tpulab.envelope import ErrorEnvelope
from tpulab.errors import ConfigError, UnreachableError
from tpulab.exits import EXIT_CONFIG, EXIT_LOCAL_STATE
from tpulab.run.session_state import SessionState

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

# DESIGN §6: USD per chip-hour, and spot at a fifth. v5litepod-4 has 4 chips, v6e-8 8.
V5E_CHIP_HOUR = 1.20
V6E_CHIP_HOUR = 2.70
SPOT = 0.2
V5LITEPOD_4_HOUR = 4 * V5E_CHIP_HOUR  # 4.80
V6E_8_SPOT_HOUR = 8 * V6E_CHIP_HOUR * SPOT  # 4.32

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def _write(
    journal_path: Path,
    run_id: str,
    accelerator: str,
    started: datetime,
    closed: tuple[TeardownResult, datetime] | None = None,
    *,
    spot: bool = False,
    emulated: bool = False,
    live: bool = False,
    zone: str = "us-central1-a",
    phase: str = "create",
) -> None:
    """One row as a run writes it: opened at `started`, closed (if) at the given time.
    `live`: owned by this process (a run in progress); otherwise by no process."""
    clock = [started]
    journal = Journal(journal_path, now=lambda: clock[0])
    fields = {
        "run_id": run_id,
        "project": "proj",
        "zone": zone,
        "node_name": f"tpulab-{run_id}",
        "accelerator": accelerator,
        "target": "emulate" if emulated else "google",
        "emulated": emulated,
        "spot": spot,
        "started": started,
        "phase": phase,
    }
    row = RunRow.for_this_process(**fields) if live else RunRow(**fields)  # type: ignore[arg-type]
    journal.open_run(row)
    if closed is not None:
        result, at = closed
        clock[0] = at
        journal.close_run(run_id, result)


def _edge_cases(path: Path, now: datetime = NOW) -> None:
    """Two days, two types, spot, every closure, an emulated run, an unknown type."""
    yesterday = now - timedelta(days=1)
    _write(
        path, "day1-v5e", "v5litepod-4", yesterday, ("confirmed", yesterday + timedelta(minutes=30))
    )
    spot_start = now - timedelta(hours=3)
    _write(
        path,
        "spot-v6e",
        "v6e-8",
        spot_start,
        ("confirmed", spot_start + timedelta(hours=1)),
        spot=True,
    )
    refused = now - timedelta(hours=2)
    _write(
        path, "refused", "v5litepod-4", refused, ("not-created", refused + timedelta(seconds=40))
    )
    unconfirmed = now - timedelta(minutes=20)
    _write(
        path,
        "unconfirmed",
        "v5litepod-4",
        unconfirmed,
        ("unconfirmed", unconfirmed + timedelta(minutes=5)),
    )
    _write(path, "orphan", "v5litepod-4", now - timedelta(minutes=10))
    emulated = now - timedelta(hours=1)
    _write(
        path,
        "emulated",
        "v5litepod-4",
        emulated,
        ("confirmed", emulated + timedelta(minutes=2)),
        emulated=True,
    )
    future = now - timedelta(hours=4)
    _write(path, "future-type", "v9x-8", future, ("confirmed", future + timedelta(minutes=6)))


def usd(amount: float | None, places: int = 6) -> float | None:
    """Money compared to `places` decimals (float sums differ in the last bits)."""
    return None if amount is None else round(amount, places)


def _by_id(found: Ledger) -> dict[str, tuple[str, float, float | None, bool]]:
    return {
        e.row.run_id: (e.state, e.billed_seconds, usd(e.estimated_cost), e.still_billing)
        for e in found.entries
    }


def test_each_row_bills_from_create_sent_to_its_confirmed_deletion(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    _edge_cases(path)
    found = ledger(now=NOW, journal=Journal(path))
    rows = _by_id(found)
    assert rows["day1-v5e"] == ("deleted", 1800.0, usd(V5LITEPOD_4_HOUR / 2), False)
    assert rows["spot-v6e"] == ("deleted", 3600.0, usd(V6E_8_SPOT_HOUR), False)
    # Refused: nothing existed, whatever time passed before the row was closed.
    assert rows["refused"] == ("not-created", 0.0, 0.0, False)
    # May still exist: billed up to now (not to the unconfirmed close), and flagged.
    assert rows["unconfirmed"] == ("unconfirmed", 1200.0, usd(V5LITEPOD_4_HOUR / 3), True)
    assert rows["orphan"] == ("open", 600.0, usd(V5LITEPOD_4_HOUR / 6), True)
    assert rows["emulated"] == ("deleted", 120.0, 0.0, False)
    # A type this catalog does not know: its time is kept, its price is not guessed.
    assert rows["future-type"] == ("deleted", 360.0, None, False)
    # Newest first, like `list` and `receipts list`.
    assert [e.row.run_id for e in found.entries][:2] == ["orphan", "unconfirmed"]


def test_totals_per_utc_day_per_accelerator_and_the_emulated_apart(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    _edge_cases(path)
    found = ledger(now=NOW, journal=Journal(path))
    v5e = V5LITEPOD_4_HOUR * (0.5 + 1 / 3 + 1 / 6)  # day1 30 min, unconfirmed 20, orphan 10
    today = V6E_8_SPOT_HOUR + V5LITEPOD_4_HOUR * (1 / 3 + 1 / 6)
    days = {
        t.key: (t.runs, t.billed_seconds, usd(t.estimated_cost), t.still_billing)
        for t in found.by_day
    }
    assert days == {
        "2026-11-30": (1, 1800.0, usd(V5LITEPOD_4_HOUR / 2), 0),
        "2026-12-01": (5, 3600.0 + 1200 + 600 + 360, usd(today), 2),
    }
    types = {t.key: (t.runs, usd(t.estimated_cost), t.unpriced) for t in found.by_accelerator}
    assert types == {
        "v5litepod-4": (4, usd(v5e), 0),
        "v6e-8": (1, usd(V6E_8_SPOT_HOUR), 0),
        "v9x-8": (1, 0.0, 1),
    }
    assert found.total.runs == 6  # the emulated run is not among them
    assert found.total.estimated_cost == pytest.approx(v5e + V6E_8_SPOT_HOUR)
    assert found.total.unpriced == 1
    assert found.total.still_billing == 2
    assert (found.emulated_total.runs, found.emulated_total.billed_seconds) == (1, 120.0)
    assert found.emulated_total.estimated_cost == 0.0


def test_a_run_crossing_midnight_counts_on_the_day_it_started(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    start = datetime(2026, 11, 30, 23, 30, tzinfo=timezone.utc)
    _write(path, "late", "v5litepod-4", start, ("confirmed", start + timedelta(hours=1)))
    found = ledger(now=NOW, journal=Journal(path))
    assert [(t.key, t.billed_seconds) for t in found.by_day] == [("2026-11-30", 3600.0)]


def test_an_open_row_of_a_run_in_progress_is_running_not_orphaned(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    _write(path, "live", "v5litepod-4", NOW - timedelta(minutes=6), live=True)
    (entry,) = ledger(now=NOW, journal=Journal(path)).entries
    assert (entry.state, entry.still_billing, entry.billed_seconds) == ("running", True, 360.0)


def test_a_forgotten_row_bills_until_it_was_forgotten_and_no_longer_nags(tmp_path: Path) -> None:
    # `teardown --forget` closes rows whose endpoint is gone: never confirmed, so not
    # "deleted", but no longer something the ledger can call still billing either.
    path = tmp_path / "journal.sqlite3"
    start = NOW - timedelta(hours=2)
    _write(path, "gone", "v5litepod-4", start, ("forgotten", start + timedelta(minutes=45)))
    (entry,) = ledger(now=NOW, journal=Journal(path)).entries
    assert (entry.state, entry.still_billing, entry.billed_seconds) == ("forgotten", False, 2700.0)
    assert usd(entry.estimated_cost) == usd(V5LITEPOD_4_HOUR * 0.75)


def test_since_keeps_newer_runs_and_every_run_that_may_still_bill(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    _edge_cases(path)
    old = NOW - timedelta(days=3)
    _write(path, "old-orphan", "v5litepod-4", old)  # never closed: may bill for 3 days
    found = ledger(since=NOW - timedelta(minutes=90), now=NOW, journal=Journal(path))
    assert set(_by_id(found)) == {"unconfirmed", "orphan", "emulated", "old-orphan"}
    assert _by_id(found)["old-orphan"][1] == 3 * 86400.0
    assert found.since == NOW - timedelta(minutes=90)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=timezone.utc)),
        ("2026-11-30T14:00", datetime(2026, 11, 30, 14, tzinfo=timezone.utc)),
        ("2026-11-30T14:00+01:00", datetime(2026, 11, 30, 13, tzinfo=timezone.utc)),
        ("7d", NOW - timedelta(days=7)),
        ("1h30m", NOW - timedelta(minutes=90)),
    ],
)
def test_since_reads_dates_date_times_and_durations(text: str, expected: datetime) -> None:
    assert costs_inputs(since=text, now=NOW).since == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("yesterday", "Invalid --since 'yesterday'"),
        ("2026", "a number needs a unit"),
        ("2026-13-01", "Invalid --since"),
        ("2027-01-01", "in the future"),
        ("  ", "--since is empty"),
        # Past datetime's range: was an OverflowError traceback (exit 1).
        ("999999d", "out of range: a duration back from now is at most 3650d"),
        ("9999999999999d", "out of range"),
        ("3651d", "out of range"),
    ],
)
def test_a_bad_since_is_a_config_error_that_teaches(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        costs_inputs(since=text, now=NOW)
    assert caught.value.hint is not None
    assert "7d" in caught.value.hint


def _failover_rows(path: Path, now: datetime) -> None:
    """One run that failed over (stockout, quota, then 20 minutes up), a run whose id only
    looks like an attempt, and an ordinary run, as Lifecycle's attempts journal them."""
    start = now - timedelta(hours=1)
    _write(path, "fo", "v5litepod-4", start, ("confirmed", start + timedelta(minutes=2)))
    second = start + timedelta(minutes=3)
    _write(
        path,
        "fo-a2",
        "v5litepod-4",
        second,
        ("not-created", second + timedelta(seconds=5)),
        zone="us-south1-a",
    )
    third = start + timedelta(minutes=4)
    _write(
        path,
        "fo-a3",
        "v5litepod-4",
        third,
        ("confirmed", third + timedelta(minutes=20)),
        zone="us-west4-a",
    )
    lone = now - timedelta(minutes=30)
    _write(path, "exp-a2", "v5litepod-4", lone, ("confirmed", lone + timedelta(minutes=5)))
    plain = now - timedelta(minutes=10)
    _write(path, "plain", "v5litepod-4", plain, ("confirmed", plain + timedelta(minutes=1)))


def test_failover_attempts_are_grouped_under_their_run(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    _failover_rows(path, NOW)
    found = ledger(now=NOW, journal=Journal(path))
    runs = {r.run_id: [(e.row.run_id, e.attempt) for e in r.entries] for r in found.runs}
    assert runs == {
        "fo": [("fo", 1), ("fo-a2", 2), ("fo-a3", 3)],
        # No row "exp" in the journal: the id only ends like a suffix; it is its own run.
        "exp-a2": [("exp-a2", 1)],
        "plain": [("plain", 1)],
    }
    assert [r.run_id for r in found.runs] == ["plain", "exp-a2", "fo"]  # newest first
    (failover,) = [r for r in found.runs if r.run_id == "fo"]
    assert (failover.attempts, failover.billed_seconds) == (3, 22 * 60.0)
    assert usd(failover.estimated_cost) == usd(V5LITEPOD_4_HOUR * 22 / 60)
    # Totals count the run once and its attempts apart; every row stays an entry.
    assert (found.total.runs, found.total.attempts) == (3, 5)
    assert len(found.entries) == 5


def test_costs_json_groups_attempts_and_keeps_each_attempts_entry(tpulab_home: Path) -> None:
    now = datetime.now(timezone.utc)
    _failover_rows(paths.journal_path(), now)
    status, out, _ = invoke("costs", "--json")
    assert status == 0
    document = CostsEnvelope.model_validate_json(out)
    groups = {e.run_id: (e.group_run_id, e.attempt) for e in document.entries}
    assert groups == {
        "fo": ("fo", 1),
        "fo-a2": ("fo", 2),
        "fo-a3": ("fo", 3),
        "exp-a2": ("exp-a2", 1),
        "plain": ("plain", 1),
    }
    runs = {r.run_id: (r.attempts, r.attempt_run_ids, r.billed_seconds) for r in document.runs}
    assert runs["fo"] == (3, ["fo", "fo-a2", "fo-a3"], 22 * 60.0)
    assert runs["exp-a2"] == (1, ["exp-a2"], 5 * 60.0)
    assert (document.total.runs, document.total.attempts) == (3, 5)


def test_costs_text_lists_attempts_under_their_run(tpulab_home: Path) -> None:
    _failover_rows(paths.journal_path(), datetime.now(timezone.utc))
    status, out, _ = invoke("costs")
    assert status == 0, out
    lines = out.splitlines()
    (head,) = [i for i, line in enumerate(lines) if line.split()[2:3] == ["fo"]]
    assert "3 attempts" in lines[head]
    assert "us-central1-a > us-south1-a > us-west4-a" in lines[head]
    assert f"${V5LITEPOD_4_HOUR * 22 / 60:.2f}" in lines[head]
    # The attempts follow their run's line, in order, each with its full run id.
    assert [line.split()[2:4] for line in lines[head + 1 : head + 4]] == [
        ["#1", "fo"],
        ["#2", "fo-a2"],
        ["#3", "fo-a3"],
    ]
    assert "not created" in lines[head + 2]
    assert "Total: 3 billable run(s) (5 attempts)" in out


# -- the command ----------------------------------------------------------------------


def _recent_rows(now: datetime) -> None:
    """Closed rows (exact figures whatever the clock says) around a real `now`."""
    path = paths.journal_path()
    start = now - timedelta(hours=5)
    _write(
        path, "five-hours-ago", "v5litepod-4", start, ("confirmed", start + timedelta(minutes=15))
    )
    start = now - timedelta(minutes=30)
    _write(
        path,
        "half-hour-ago",
        "v6e-8",
        start,
        ("confirmed", start + timedelta(minutes=10)),
        spot=True,
    )


def test_costs_json_is_the_pinned_envelope_with_the_figures(tpulab_home: Path) -> None:
    _recent_rows(datetime.now(timezone.utc))
    status, out, _ = invoke("costs", "--json")
    assert status == 0
    document = CostsEnvelope.model_validate_json(out)
    assert (document.command, document.ok, document.price_date) == ("costs", True, PRICE_DATE)
    costs = {e.run_id: (e.accelerator_type, e.spot, e.estimated_cost_usd) for e in document.entries}
    assert costs == {
        "five-hours-ago": ("v5litepod-4", False, usd(V5LITEPOD_4_HOUR / 4, 4)),
        "half-hour-ago": ("v6e-8", True, usd(V6E_8_SPOT_HOUR / 6, 4)),
    }
    total = V5LITEPOD_4_HOUR / 4 + V6E_8_SPOT_HOUR / 6
    assert document.total.estimated_cost_usd == pytest.approx(total, abs=1e-4)
    assert document.total.billed_seconds == 25 * 60
    assert {t.key for t in document.by_accelerator} == {"v5litepod-4", "v6e-8"}

    status, out, _ = invoke("costs", "--json", "--since", "2h")
    assert status == 0
    assert [e.run_id for e in CostsEnvelope.model_validate_json(out).entries] == ["half-hour-ago"]


def test_costs_prints_a_ledger_with_totals_and_flags_what_may_still_bill(
    tpulab_home: Path,
) -> None:
    now = datetime.now(timezone.utc)
    _recent_rows(now)
    _write(paths.journal_path(), "orphan", "v5litepod-4", now - timedelta(minutes=3))
    status, out, err = invoke("costs")
    assert status == 0
    lines = {
        line.split()[2]: line for line in out.splitlines() if "-ago" in line or "orphan" in line
    }
    assert "$1.20" in lines["five-hours-ago"]
    assert "deleted (confirmed)" in lines["five-hours-ago"]
    assert "v6e-8 (spot)" in lines["half-hour-ago"]
    assert "$0.72" in lines["half-hour-ago"]
    assert "so far" in lines["orphan"]
    assert "still billing?" in lines["orphan"]
    assert "Per UTC day" in out
    assert "Per accelerator" in out
    assert f"at {PRICE_DATE} list prices" in out
    assert "1 run(s) may still be billing" in err
    assert "tpulab teardown --verify" in err


def test_an_empty_journal_says_so(tpulab_home: Path) -> None:
    status, out, _ = invoke("costs", "--since", "1d")
    assert status == 0
    assert "No runs in this machine's journal since" in out


def test_a_since_past_datetimes_range_exits_2_with_the_range(tpulab_home: Path) -> None:
    status, _, err = invoke("costs", "--since", "999999d")
    assert status == EXIT_CONFIG
    assert "at most 3650d" in err
    assert "Traceback" not in err
    assert "OverflowError" not in err


@pytest.mark.parametrize("as_json", [False, True])
def test_a_bad_since_exits_2_and_reads_nothing(tpulab_home: Path, as_json: bool) -> None:
    status, out, err = invoke("costs", "--since", "last tuesday", *(["--json"] if as_json else []))
    assert status == EXIT_CONFIG
    if as_json:
        document = ErrorEnvelope.model_validate_json(out)
        assert (document.command, document.error.type) == ("costs", "ConfigError")
    else:
        assert "Invalid --since 'last tuesday'" in err
        assert "7d" in err
    assert not paths.journal_path().exists()  # validated before the journal was opened


@pytest.mark.parametrize("as_json", [False, True])
def test_an_unreadable_journal_is_the_local_state_error(tpulab_home: Path, as_json: bool) -> None:
    path = paths.journal_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    status, out, err = invoke("costs", *(["--json"] if as_json else []))
    assert status == EXIT_LOCAL_STATE
    text = ErrorEnvelope.model_validate_json(out).error.message if as_json else err
    assert "unreadable" in text


# -- real runs ------------------------------------------------------------------------


def _timed(action: Callable[[], object]) -> tuple[datetime, datetime]:
    before = datetime.now(timezone.utc)
    action()
    return before, datetime.now(timezone.utc)


def test_real_emulated_runs_are_listed_with_their_time_at_no_cost(
    embedded_rig: Rig, tpulab_home: Path
) -> None:
    journal = RunJournalAdapter(Journal())
    spec = embedded_rig.spec("v5litepod-1")
    life, _ = embedded_rig.lifecycle(spec, journal=journal)
    before, after = _timed(life.run)
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []
    # A create that never left (nothing listens at the endpoint): closed "not-created".
    refused = embedded_rig.spec("v5litepod-1")
    with refused_port() as port:
        dead = GoogleTpuApi(refused.project.value, api_endpoint=f"http://127.0.0.1:{port}")
        refused_run, _ = embedded_rig.lifecycle(refused, journal=journal, api=dead)
        with pytest.raises(UnreachableError):
            refused_run.run()
    assert refused_run.outcome.teardown_status == "not-created"

    status, out, _ = invoke("costs", "--json")
    assert status == 0
    document = CostsEnvelope.model_validate_json(out)
    entries = {e.run_id: e for e in document.entries}
    ran = entries[spec.run_id]
    assert (ran.emulated, ran.state, ran.still_billing) == (True, "deleted", False)
    assert (ran.accelerator_type, ran.zone) == ("v5litepod-1", spec.zone.value)
    # The row opens after the run began and closes before it returned.
    assert 0 < ran.billed_seconds <= (after - before).total_seconds() + 0.1
    assert ran.estimated_cost_usd == 0.0
    assert entries[refused.run_id].state == "not-created"
    assert entries[refused.run_id].billed_seconds == 0.0
    assert document.total.runs == 0
    assert document.total.estimated_cost_usd == 0.0
    assert document.emulated_total.runs == 2
    assert document.emulated_total.billed_seconds == ran.billed_seconds
    status, out, _ = invoke("costs")
    assert "emulated" in out
    assert "an emulator bills nothing" in out


def test_the_ledger_reads_every_row_not_only_the_newest_hundred(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    start = NOW - timedelta(days=2)
    for index in range(120):
        began = start + timedelta(minutes=index)
        _write(
            path, f"r{index:03d}", "v5litepod-4", began, ("confirmed", began + timedelta(minutes=1))
        )
    started = time.monotonic()
    found = ledger(now=NOW, journal=Journal(path))
    assert found.total.runs == 120
    assert found.total.estimated_cost == pytest.approx(120 * V5LITEPOD_4_HOUR / 60)
    assert time.monotonic() - started < 2.0


def _session(name: str, run_id: str, started: datetime, *, ttl: float, idle: float) -> SessionState:
    """A session's state as `tpulab up` saves it (only the fields costs reads matter)."""
    begun = started.timestamp()
    return SessionState(
        name=name,
        run_id=run_id,
        node_name=f"tpulab-{run_id}",
        zone="us-central1-a",
        project="proj",
        api_endpoint=None,
        accelerator_type="v5litepod-4",
        spot=False,
        ssh_user="tpulab",
        ssh_host="127.0.0.1",
        ssh_port=22,
        host_key_type="ssh-ed25519",
        host_key_b64="AAAA",
        # A session's state without its watchdog is damaged (set aside): a whole one.
        watchdog={
            "run_id": run_id,
            "node_name": f"tpulab-{run_id}",
            "zone": "us-central1-a",
            "project": "proj",
            "lease_seconds": idle,
            "boot_grace_seconds": 300.0,
            "max_duration_seconds": ttl,
        },
        started_at=begun,
        deadline_at=begun + ttl,
        idle_seconds=idle,
        renewed_at=begun,
    )


def test_sessions_show_as_sessions_up_to_now_or_to_where_they_ended(tpulab_home: Path) -> None:
    now = datetime.now(timezone.utc)
    store = SessionStore()
    path = paths.journal_path()
    # Up: its state is here and neither deadline nor idle expiry has passed.
    up_start = now - timedelta(minutes=30)
    _write(path, "sess-up", "v5litepod-4", up_start, phase="session")
    store.reserve("lesson", b"key")
    store.save(_session("lesson", "sess-up", up_start, ttl=7200, idle=3600))
    # Ended on its own: found gone after its idle expiry, billed to that expiry.
    idle_start = now - timedelta(hours=3)
    _write(path, "sess-idle", "v5litepod-4", idle_start, phase="session")
    idled = _session("idled", "sess-idle", idle_start, ttl=7200, idle=1800)
    store.reserve("idled", b"key")
    store.save(idled)
    conclude_gone(store, idled, why_gone(idled, now=now.timestamp()), seen_by="a test")
    # Open, but its state is gone: nobody here is in charge of it.
    _write(path, "sess-lost", "v5litepod-4", now - timedelta(minutes=10), phase="session")

    found = ledger(now=now)
    entries = {e.row.run_id: e for e in found.entries}
    assert {k: (e.kind, e.state) for k, e in entries.items()} == {
        "sess-up": ("session", "up"),
        "sess-idle": ("session", "deleted"),
        "sess-lost": ("session", "open"),
    }
    assert entries["sess-up"].billed_seconds == pytest.approx(30 * 60, abs=1)
    assert entries["sess-up"].session == "lesson"
    assert entries["sess-idle"].billed_seconds == pytest.approx(30 * 60, abs=1)
    assert usd(entries["sess-idle"].estimated_cost) == usd(V5LITEPOD_4_HOUR / 2)

    status, out, err = invoke("costs")
    assert status == 0
    lines = {line.split()[2]: line for line in out.splitlines() if "sess-" in line}
    assert "v5litepod-4 (session)" in lines["sess-up"]
    assert "session lesson up" in lines["sess-up"]
    assert "so far" in lines["sess-up"]
    assert "session, deleted (confirmed)" in lines["sess-idle"]
    assert "still billing?" in lines["sess-lost"]
    assert "1 run(s) may still be billing" in err  # sess-lost only, not the session up
    assert "1 session(s) up (lesson)" in err
    status, out, _ = invoke("costs", "--json")
    document = CostsEnvelope.model_validate_json(out)
    assert {(e.run_id, e.kind, e.session, e.state) for e in document.entries} == {
        ("sess-up", "session", "lesson", "up"),
        ("sess-idle", "session", None, "deleted"),
        ("sess-lost", "session", None, "open"),
    }
