"""How long each command takes to fail against a dead endpoint, next to a live emulator.

Three dead endpoints, each real: a closed loopback port (refused), a listener that
accepts and never answers (blackhole), and a name under `.invalid` (never resolves; not
loopback, so it gets the 15 s network-blip schedule). Each command runs as the user runs
it (a fresh process), and the same command against a live served emulator is timed in
the same run, so the table reads against this machine's load (the imports alone take
seconds on a busy one). Before this change the same commands took from 12 s to 12 min.
Run: `pytest tests/benchmarks/bench_dead_endpoint.py -s`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers import Blackhole, create_ready_node, refused_port

from benchmarks.smoke import SMOKE
from tpulab.cleanup.sessions import SessionStore
from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator import Emulator, Timing
from tpulab.models import tpulab_labels
from tpulab.run.session_state import SessionState

PROJECT = "bench-project"
ZONE = "us-central1-a"
# Exit status of each command when the endpoint cannot be reached (README "Exit codes").
# A run whose CreateNode was sent and never answered (blackhole) cannot know that no node
# exists: 6, "may still be billing", with the commands that finish it.
EXPECTED = {"list": 3, "teardown": 6, "down": 6, "run": 3}
EXPECTED_AFTER_A_SENT_CREATE = {"run": 6}
COMMANDS = ("list", "teardown", "down", "run")
KINDS = ("refused", "blackhole", "unresolvable")
# The smoke run (tests/benchmarks/smoke.py) times each command against one dead kind,
# each kind at least once and `run` against the blackhole (the sent-create case): every
# branch of this benchmark, 4 commands instead of 12. The unresolvable name waits out
# the 15 s network-blip schedule and the blackhole its bounded try, so the whole grid
# kept a CI worker for minutes; tests/test_dead_endpoint.py checks each pairing.
SMOKE_CASES = (("list", "unresolvable"), ("teardown", "refused"), ("down", "refused"),
               ("run", "blackhole"))  # fmt: skip


def _cases() -> list[tuple[str, str]]:
    """(command, dead kind) pairs to time: the whole grid for the figures."""
    if SMOKE:
        # Every command and every kind, whatever this table becomes.
        assert {command for command, _ in SMOKE_CASES} == set(COMMANDS)
        assert {kind for _, kind in SMOKE_CASES} == set(KINDS)
        return list(SMOKE_CASES)
    return [(command, kind) for command in COMMANDS for kind in KINDS]


def _session(home: Path, url: str, node: str) -> None:
    os.environ["TPULAB_HOME"] = str(home)  # SessionStore() reads it, as tpulab does
    store = SessionStore()
    store.reserve("bench", b"not a real key")
    now = time.time()
    run_id = node.removeprefix("tpulab-")
    # A whole watchdog: a session's state without one is damaged (set aside).
    watchdog = {
        "run_id": run_id, "node_name": node, "zone": ZONE, "project": PROJECT,
        "lease_seconds": 600.0, "boot_grace_seconds": 300.0, "max_duration_seconds": 3600.0,
    }  # fmt: skip
    store.save(
        SessionState(
            name="bench", run_id=node.removeprefix("tpulab-"), node_name=node, zone=ZONE,
            project=PROJECT, api_endpoint=url, accelerator_type="v5litepod-4", spot=False,
            ssh_user="u", ssh_host="127.0.0.1", ssh_port=22, host_key_type="ssh-ed25519",
            host_key_b64="AAAA", watchdog=watchdog, started_at=now, deadline_at=now + 3600,
            idle_seconds=600, renewed_at=now,
        )
    )  # fmt: skip


def _args(command: str, url: str) -> list[str]:
    where = ["--api-endpoint", url, "--project", PROJECT, "--zone", ZONE]
    return {
        "list": ["list", *where],
        "teardown": ["teardown", "--verify", "--yes", *where],
        "down": ["down", "bench"],
        "run": [
            "run",
            "--accelerator",
            "v5litepod-4",
            *where,
            "--project",
            PROJECT,
            "--zone",
            ZONE,
        ],
    }[command]


def _timed(command: str, url: str, home: Path) -> tuple[float, int, str]:
    env = {**os.environ, "TPULAB_HOME": str(home), "NO_GCE_CHECK": "True"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", *_args(command, url)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return time.perf_counter() - started, done.returncode, done.stdout + done.stderr


def _time_all(
    cases: list[tuple[str, str]], dead: dict[str, str], homes: dict[tuple[str, str], Path]
) -> list[tuple[float, int, str]]:
    """Each case timed: one after the other for the figures; side by side in smoke mode,
    where no timing is asserted and the cases mostly wait (the unresolvable name its
    15 s schedule, the blackhole its bounded tries): one at a time they kept a CI
    worker for ~50 s, side by side for the longest of them."""
    if not SMOKE:
        return [_timed(command, dead[kind], homes[command, kind]) for command, kind in cases]
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        futures = [pool.submit(_timed, c, dead[k], homes[c, k]) for c, k in cases]
        return [future.result() for future in futures]


def test_dead_endpoints_fail_in_seconds(tmp_path: Path) -> None:
    hole = Blackhole()
    held = contextlib.ExitStack()  # the refused port stays bound, never listening
    dead = {
        "refused": f"http://127.0.0.1:{held.enter_context(refused_port())}",
        "blackhole": hole.url,
        "unresolvable": "http://tpu-nowhere.invalid:8470",
    }
    assert set(dead) == set(KINDS)
    rows: list[tuple[str, str, int, float]] = []
    saved_home = os.environ.get("TPULAB_HOME")
    try:
        with Emulator(tmp_path / "emulator", timing=Timing.fast()) as live:
            api = GoogleTpuApi(PROJECT, api_endpoint=live.url)
            for command in ("list", "teardown", "down"):
                home = tmp_path / f"live-{command}"
                if command == "down":
                    node = "tpulab-bench-live"
                    create_ready_node(api, node, tpulab_labels("bench-live"), ZONE)
                    _session(home, live.url, node)
                seconds, status, output = _timed(command, live.url, home)
                assert status == 0, output
                rows.append((command, "live emulator", status, seconds))
        cases = _cases()
        homes = {case: tmp_path / "-".join(case) for case in cases}
        for (command, kind), home in homes.items():
            if command == "down":
                _session(home, dead[kind], "tpulab-bench-dead")
        timed = _time_all(cases, dead, homes)
        for (command, kind), (seconds, status, output) in zip(cases, timed, strict=True):
            expected = EXPECTED[command]
            if kind == "blackhole":
                expected = EXPECTED_AFTER_A_SENT_CREATE.get(command, expected)
            assert status == expected, output
            reached = ("cannot reach the Cloud TPU API at", "is not reachable")
            assert any(words in output for words in reached), output
            rows.append((command, kind, status, seconds))
    finally:
        hole.close()
        held.close()
        if saved_home is None:
            os.environ.pop("TPULAB_HOME", None)
        else:
            os.environ["TPULAB_HOME"] = saved_home
    print("\ncommand   endpoint        exit   wall")
    for command, kind, status, seconds in rows:
        print(f"{command:<9} {kind:<15} {status:>4} {seconds:>6.1f} s")
