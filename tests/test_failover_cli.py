"""`tpulab run` across zones and preemptions as a user runs it: a real subprocess against
a served emulator (real HTTP, real SSH hosts), its --json attempts table and exit
statuses, Ctrl-C during a failover gap, and SIGKILL during attempt 2 cleaned up by
`tpulab teardown --verify`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpulab.emulator.backends import make_host_backend
from tpulab.exits import EXIT_CLOUD, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED
from tpulab.run.report import RunEnvelope

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

PROJECT = "failover-project"


def _env() -> dict[str, str]:
    # Read at call time: the autouse fixture points TPULAB_HOME at this test's own home.
    return {**os.environ, "COLUMNS": "200"}


@pytest.fixture
def served(start_emulator: EmulatorStarter, tmp_path: Path) -> Iterator[Emulator]:
    backend = make_host_backend("embedded", tmp_path / "ssh-hosts", image="preloaded")
    emulator = start_emulator(tmp_path / "served", host_backend=backend)
    try:
        yield emulator
    finally:
        emulator.stop()
        backend.close()


def _args(emulator: Emulator, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-4",
        "--api-endpoint", emulator.url, "--project", PROJECT, "--teardown-timeout", "30",
        *extra,
    ]  # fmt: skip


def _run(emulator: Emulator, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _args(emulator, *extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        check=False,
    )


def _document(done: subprocess.CompletedProcess[str]) -> RunEnvelope:
    try:
        return RunEnvelope.model_validate_json(done.stdout)
    except ValueError:
        pytest.fail(f"no RunEnvelope (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


def _creates(emulator: Emulator) -> list[str]:
    return [
        r["path"].split("/locations/")[1].split("/")[0]
        for r in emulator.requests()
        if r["method"] == "POST" and r["path"].endswith("/nodes")
    ]


@pytest.mark.slow
def test_zone_auto_fails_over_to_capacity_and_reports_every_attempt(served: Emulator) -> None:
    served.faults.stockout_zones = ["us-central1-a"]
    served.faults.quota_zones = ["us-south1-a"]
    done = _run(served, "--zone", "auto", "--json")
    assert done.returncode == EXIT_OK, done.stderr
    result = _document(done)
    assert result.ok
    assert result.zone == "us-west1-c"
    assert result.receipt.verdict == "verified"
    table = [(a.number, a.zone, a.how, a.outcome, a.teardown, a.teardown_confirmed)
             for a in result.attempts]  # fmt: skip
    assert table == [
        (1, "us-central1-a", "on-demand", "stockout", "confirmed", True),
        (2, "us-south1-a", "on-demand", "quota", "not-created", True),
        (3, "us-west1-c", "on-demand", "verified", "confirmed", True),
    ]
    assert [a.run_id for a in result.attempts] == [
        result.attempts[0].run_id,
        f"{result.attempts[0].run_id}-a2",
        f"{result.attempts[0].run_id}-a3",
    ]
    assert result.run_id == result.attempts[-1].run_id
    assert "capacity" in result.attempts[0].reason
    # Each figure is rounded to 4 places on its own: the sum may differ by their rounding.
    assert result.estimated_cost_usd == pytest.approx(
        sum(a.estimated_cost_usd for a in result.attempts), abs=2.5e-4
    )
    assert _creates(served) == ["us-central1-a", "us-south1-a", "us-west1-c"]
    assert served.node_names() == []


def test_permission_denied_stops_before_any_other_zone(served: Emulator) -> None:
    served.faults.deny_zones = ["us-central1-a"]
    done = _run(served, "--zone", "us-central1-a,us-west1-c", "--json")
    assert done.returncode == EXIT_CLOUD, done.stderr
    result = _document(done)
    assert [(a.zone, a.outcome) for a in result.attempts] == [
        ("us-central1-a", "permission-denied")
    ]
    assert result.error is not None
    assert result.error.type == "PermissionDeniedError"
    assert _creates(served) == ["us-central1-a"]
    assert served.node_names() == []


@pytest.mark.slow
def test_retry_until_up_succeeds_when_capacity_arrives_after_8s(served: Emulator) -> None:
    served.faults.stockout_zones = ["us-central1-a"]
    served.faults.capacity_after = {"us-central1-a": 8.0}
    done = _run(served, "--zone", "us-central1-a", "--retry-until-up", "--retry-for", "20s")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    out = done.stdout
    assert "(previous: stockout in us-central1-a)" in out
    assert "next pass over the zones in" in out
    # The summary's attempts table: every attempt a stockout in the zone, but the last,
    # verified and deleted ("verified" anywhere would also match "unverified").
    attempts = re.findall(r"^ +\d+\. (\S+) +\S+ +(\S+) +[\d.]+s  (.+?) *$", out, re.MULTILINE)
    assert len(attempts) >= 2, out
    assert attempts[-1] == ("us-central1-a", "verified", "deleted, confirmed"), attempts
    assert all(outcome != "verified" for _, outcome, _ in attempts[:-1]), attempts
    assert served.node_names() == []


def test_retry_until_up_without_capacity_is_a_capacity_error(served: Emulator) -> None:
    served.faults.stockout = True
    started = time.monotonic()
    done = _run(served, "--zone", "us-central1-a", "--retry-until-up", "--retry-for", "20s")
    assert done.returncode == EXIT_CLOUD, done.stdout + done.stderr
    assert 20 <= time.monotonic() - started < 60
    assert "No zone had capacity" in done.stderr
    assert "--retry-for 20s" in done.stderr
    assert served.node_names() == []


def test_preempted_twice_with_one_recovery_exits_7_and_leaves_nothing(served: Emulator) -> None:
    served.faults.preempt_after = 0.0  # every spot node, as soon as it is READY
    done = _run(served, "--zone", "us-central1-a,us-west1-c", "--spot", "--recover", "1", "--json")
    assert done.returncode == EXIT_PREEMPTED, done.stderr
    result = _document(done)
    assert [(a.zone, a.how, a.outcome, a.teardown) for a in result.attempts] == [
        ("us-central1-a", "spot", "preempted", "confirmed"),
        ("us-west1-c", "spot", "preempted", "confirmed"),
    ]
    assert served.node_names() == []


def _read_until(process: subprocess.Popen[str], seen: Callable[[str], bool], limit: float) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + limit
    text = ""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        text += line
        if seen(line):
            return text
    process.kill()
    pytest.fail(f"never saw the awaited line; output so far:\n{text}")


def test_sigint_during_a_failover_gap_exits_130_with_nothing_left(served: Emulator) -> None:
    served.faults.stockout = True
    process = subprocess.Popen(
        _args(served, "--zone", "us-central1-a,us-west1-c", "--retry-until-up"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    before = _read_until(process, lambda line: "next pass over the zones in" in line, 120)
    process.send_signal(signal.SIGINT)
    rest, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_INTERRUPTED, before + rest + err
    # It landed in the gap: no attempt began after the announcement.
    assert "attempt 3" not in rest
    assert served.node_names() == []


def test_sigkill_during_attempt_2_is_cleaned_by_teardown_verify(
    served: Emulator, tpulab_home: Path
) -> None:
    from tpulab.cleanup.journal import Journal

    served.faults.stockout_zones = ["us-central1-a"]
    process = subprocess.Popen(
        _args(served, "--zone", "us-central1-a,us-west1-c"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 120
        while not any(name.endswith("-a2") for name in served.node_names()):
            assert time.monotonic() < deadline, "attempt 2 never created its node"
            assert process.poll() is None, "the run ended before attempt 2's node existed"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    left = served.node_names()
    assert len(left) == 1
    assert left[0].endswith("-a2")
    rows = Journal().all_runs()
    assert len(rows) == 2  # one journal row per attempt
    assert [row.node_name for row in Journal().open_runs()] == left  # attempt 1 closed
    sweep = subprocess.run(
        [sys.executable, "-m", "tpulab", "teardown", "--verify", "--yes", "--json",
         "--api-endpoint", served.url, "--project", PROJECT, "--timeout", "60"],
        capture_output=True, text=True, timeout=180, env=_env(), check=False,
    )  # fmt: skip
    assert sweep.returncode == EXIT_OK, sweep.stdout + sweep.stderr
    assert json.loads(sweep.stdout)["deleted"] == left
    assert served.node_names() == []


@pytest.mark.parametrize(
    "flags",
    [
        ("--zone", "us-central1-a", "--recover", "1"),
        ("--zone", "us-central1-a", "--retry-for", "20s"),
        ("--zone", "us-central1-a,BAD"),
        ("--zone", "us-central1-a", "--retry-until-up", "--retry-for", "forever"),
    ],
)
def test_bad_capacity_flags_exit_2_before_any_api_call(
    start_emulator: EmulatorStarter, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    from tpulab.exits import EXIT_CONFIG

    bare = start_emulator(tmp_path / "bare")
    done = _run(bare, *flags)
    assert done.returncode == EXIT_CONFIG, done.stdout + done.stderr
    assert sum(bare.calls.values()) == 0
    assert bare.requests() == []


def test_dry_run_names_the_zones_it_would_try(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    bare = start_emulator(tmp_path / "bare")
    done = _run(bare, "--zone", "us-west4-a,auto", "--spot", "--recover", "2", "--dry-run")
    assert done.returncode == EXIT_OK, done.stderr
    assert "Attempts: us-west4-a, us-central1-a, us-south1-a" in done.stdout
    assert "recovers from 2 preemption(s)" in done.stdout
    assert bare.requests() == []  # the dry run contacts nothing
