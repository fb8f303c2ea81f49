"""Liveness across machines: a node carries its kind and its home's owner id, its
watchdog publishes its lease, and `teardown --verify` from another TPULAB_HOME keeps
live work (saying whose, and how fresh) while it still sweeps a node whose lease lapsed.

Real `tpulab` subprocesses, two homes, one emulator served from this test process whose
nodes are real SSH servers running the real watchdog at boot; nothing is mocked. The
leases are read back through the real Google client from the emulator's guest
attributes, where the nodes' own watchdogs put them."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import served_emulator, tpulab, wait_until
from test_exec import _exec_in_background, _wait_for

from tpulab.cloud.google import GoogleTpuApi
from tpulab.contract import KIND_LABEL, LEASE_ATTRIBUTE, OWNER_LABEL
from tpulab.emulator import Emulator
from tpulab.remote.watchdog import PublishedLease, parse_lease

pytestmark = pytest.mark.slow

PROJECT = "liveness-proj"
ZONE = "us-central1-a"
EXIT_OK = 0
EXIT_REMOTE = 4


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def _in(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`tpulab ARGS` as a user of `home` (its own journal, sessions and owner id)."""
    return tpulab(*args, env={"TPULAB_HOME": str(home)}, timeout=timeout)


def _where(emulator: Emulator) -> tuple[str, ...]:
    return ("--api-endpoint", emulator.url, "--project", PROJECT, "--zone", ZONE)


def _up(emulator: Emulator, home: Path, name: str, idle: str) -> dict[str, object]:
    done = _in(
        home, "up", "--accelerator", "v5litepod-4", *_where(emulator), "--boot-timeout", "30",
        "--name", name, "--ttl", "1h", "--idle", idle,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    state: dict[str, object] = json.loads(
        (home / "state" / "sessions" / name / "session.json").read_text()
    )
    return state


def _lease(api: GoogleTpuApi, node: str) -> PublishedLease | None:
    return parse_lease(api.guest_attributes(ZONE, node, "tpulab/").get(LEASE_ATTRIBUTE))


@pytest.mark.longest
def test_teardown_from_a_second_home_keeps_a_live_session_of_the_first(
    served: Emulator, tmp_path: Path
) -> None:
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    # The watchdogs may not delete: the lapsed session's node then stays, as a node
    # whose watchdog failed would, for the second home's sweep to find.
    served.faults.node_identity_cannot_delete = True
    with ThreadPoolExecutor(max_workers=2) as pool:
        live_up = pool.submit(_up, served, home_a, "live", "10m")
        dead_up = pool.submit(_up, served, home_a, "dead", "30s")  # the shortest --idle
        live, dead = live_up.result(), dead_up.result()
    live_node, dead_node = str(live["node_name"]), str(dead["node_name"])
    api = GoogleTpuApi(PROJECT, api_endpoint=served.url)

    # Each node says what it is and whose: the session kind and home A's owner id.
    owner_a = (home_a / "state" / "owner-id").read_text().strip()
    labels = api.get_node(ZONE, live_node).labels
    assert labels[KIND_LABEL] == "session"
    assert labels[OWNER_LABEL] == owner_a
    # The watchdog published its lease: renewed by `up`, for the session's --idle. It
    # publishes a renewal when its next look at the lease file sees it, which may come
    # just after `up` returned (a CI run read the boot grace's lease, renewals 0).
    wait_until(
        lambda: (found := _lease(api, live_node)) is not None and found.renewals >= 1,
        "the watchdog to publish up's renewal of the live session's lease",
    )
    lease = _lease(api, live_node)
    assert lease is not None
    assert lease.lease_seconds == 600.0
    assert lease.renewals >= 1
    assert time.time() - lease.renewed_at < 600.0
    # The other session's lease (30 s) lapses with no one renewing it; its watchdog
    # cannot delete the node, so it stays: what a leftover looks like.
    wait_until(
        lambda: (found := _lease(api, dead_node)) is not None and not found.fresh(time.time()),
        "the idle session's published lease to lapse",
    )
    assert set(served.node_names(PROJECT)) == {live_node, dead_node}

    # Home B knows neither. Its sweep keeps the live one, says why, and deletes the
    # dead one; what remains is exactly what it kept, so it exits 0.
    swept = _in(home_b, "teardown", "--verify", "--yes", *_where(served))
    assert swept.returncode == EXIT_OK, swept.stderr + swept.stdout
    assert f"{live_node}: live elsewhere (owner {owner_a}, session, renewed " in swept.stdout
    assert "kept unless --include-live or you say yes" in swept.stdout
    assert f"{dead_node}: lease lapsed (owner {owner_a}, session, renewed " in swept.stdout
    assert f"Deleted and confirmed gone: {dead_node}" in swept.stdout
    assert f"Deleted and confirmed gone: {live_node}" not in swept.stdout
    assert "only the 1 node(s) live elsewhere remain" in swept.stdout
    assert served.node_names(PROJECT) == [live_node]

    # --json names the kept node with its owner and lease.
    planned = _in(home_b, "teardown", "--verify", "--dry-run", "--json", *_where(served))
    assert planned.returncode == EXIT_OK, planned.stderr + planned.stdout
    envelope = json.loads(planned.stdout)
    (kept,) = envelope["kept_elsewhere"]
    assert kept["node_name"] == live_node
    assert kept["owner"] == owner_a
    assert kept["kind"] == "session"
    assert kept["lease_seconds"] == 600.0
    assert 0 <= kept["renewed_seconds_ago"] < 600.0
    assert envelope["ok"] is True

    # `list` shows it as a session in home A, and as live elsewhere in home B.
    listed_a = _in(home_a, "list", "--json", *_where(served), timeout=120)
    assert listed_a.returncode == EXIT_OK, listed_a.stderr
    (row_a,) = json.loads(listed_a.stdout)["nodes"]
    assert row_a["journal"].startswith("session")
    assert "orphaned" not in row_a["journal"]
    listed_b = _in(home_b, "list", "--json", *_where(served), timeout=120)
    assert listed_b.returncode == EXIT_OK, listed_b.stderr
    (row_b,) = json.loads(listed_b.stdout)["nodes"]
    assert f"live elsewhere (owner {owner_a}, session, renewed " in row_b["journal"]

    # Only an explicit --include-live takes it.
    taken = _in(home_b, "teardown", "--verify", "--yes", "--include-live", *_where(served))
    assert taken.returncode == EXIT_OK, taken.stderr + taken.stdout
    assert f"Deleted and confirmed gone: {live_node}" in taken.stdout
    assert served.node_names(PROJECT) == []


# Tells the test it started, waits for its go-ahead, then leaves an artifact.
_WAITER = """\
import os, pathlib, sys, time
started, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
started.write_text("started")
deadline = time.monotonic() + 240
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
pathlib.Path(os.environ["TPULAB_RUN_DIR"], "result.txt").write_text("kept")
"""


@pytest.mark.longest
def test_down_refuses_while_an_exec_holds_the_session_unless_forced(
    served: Emulator, tpulab_home: Path, tmp_path: Path
) -> None:
    node = str(_up(served, tpulab_home, "busy", "10m")["node_name"])
    work = tmp_path / "work"
    work.mkdir()
    (work / "waiter.py").write_text(_WAITER)

    def exec_waiting(tag: str) -> tuple[subprocess.Popen[str], Path, Path, Path]:
        started, go, out = tmp_path / f"started-{tag}", tmp_path / f"go-{tag}", tmp_path / tag
        process = _exec_in_background(
            "busy", "--workdir", str(work), "--out", str(out), "--",
            "python", "waiter.py", str(started), str(go),
        )  # fmt: skip
        _wait_for(started, process)
        return process, go, out, started

    first, go, out, _ = exec_waiting("first")
    try:
        refused = tpulab("down", "busy", timeout=120)
    finally:
        go.write_text("go")
    said = " ".join(refused.stderr.split())
    assert refused.returncode == EXIT_REMOTE, refused.stderr + refused.stdout
    record_out, record_err = first.communicate(timeout=240)
    assert first.returncode == EXIT_OK, record_err + record_out
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert (
        f"Session busy is in use: an exec holds its lock (run {run_id} from "
        f"{socket.gethostname()} (pid {first.pid}), since " in said
    ), said
    assert "Nothing was deleted." in said
    assert "`tpulab down busy --force`" in said
    # The exec it spared finished and fetched its artifact; the session is intact.
    assert (out / "run" / "result.txt").read_text() == "kept"
    assert served.node_names(PROJECT) == [node]
    assert (tpulab_home / "state" / "sessions" / "busy" / "key").exists()

    # --force deletes it under a running exec, as asked.
    second, go, _, _ = exec_waiting("second")
    try:
        forced = tpulab("down", "busy", "--force", timeout=120)
        assert forced.returncode == EXIT_OK, forced.stderr + forced.stdout
        assert served.node_names(PROJECT) == []
    finally:
        go.write_text("go")
        second.communicate(timeout=240)
    assert second.returncode != EXIT_OK
