"""`tpulab up` / `ssh` / `down` as a user types them: real subprocesses against an
emulator served from this process (a session outlives the `up` process, so the
emulator must too), whose nodes are real SSH servers reached by the system's OpenSSH
client. Nothing is mocked; every test ends by asking the emulator what is left."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import require_tool, served_emulator, tpulab, wait_until, watchdog_saw_the_last_renewal
from test_exec import _age_session

from tpulab.catalog import lookup
from tpulab.cleanup.journal import Journal
from tpulab.cleanup.report import UpEnvelope
from tpulab.emulator import Emulator

pytestmark = pytest.mark.slow

PROJECT = "session-proj"
ZONE = "us-central1-a"
EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_REMOTE = 4


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def _up(emulator: Emulator, *extra: str) -> list[str]:
    return [
        "up", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        "--project", PROJECT, "--zone", ZONE, "--boot-timeout", "30", *extra,
    ]  # fmt: skip


# How `list` writes a time left: minutes and seconds ("59m07s") under an hour.
_DURATION = re.compile(r"(\d+)m(\d\d)s")


def _seconds(shown: str) -> int:
    match = _DURATION.fullmatch(shown)
    assert match is not None, shown
    return int(match.group(1)) * 60 + int(match.group(2))


def _sessions_dir(home: Path) -> Path:
    return home / "state" / "sessions"


def _up_at_once(emulator: Emulator, *names: str, extra: tuple[str, ...] = ()) -> None:
    """`tpulab up --name N` for each name, concurrently (each is its own process)."""

    def one(name: str) -> subprocess.CompletedProcess[str]:
        return tpulab(*_up(emulator, "--name", name, *extra), timeout=300)

    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        for done in pool.map(one, names):
            assert done.returncode == EXIT_OK, done.stderr + done.stdout


def _state_of(home: Path, name: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(
        (_sessions_dir(home) / name / "session.json").read_text()
    )
    return loaded


def test_up_ssh_down_leaves_nothing(served: Emulator, tpulab_home: Path) -> None:
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")
    up = tpulab(
        *_up(served, "--name", "lesson-1", "--ttl", "1h", "--idle", "10m", "--json"), timeout=300
    )
    assert up.returncode == EXIT_OK, up.stderr + up.stdout
    # --json: the session as an envelope on stdout, the progress on stderr.
    envelope = UpEnvelope.model_validate_json(up.stdout)
    assert envelope.ok
    assert envelope.session is not None
    assert envelope.session.name == "lesson-1"
    assert envelope.run.receipt.verdict == "verified"
    assert envelope.run.receipt.id is not None
    assert "Verify" in up.stderr
    # The node is kept, and the session's key is on disk, owner-only.
    (node,) = served.node_names(PROJECT)
    assert envelope.session.node_name == node
    key = _sessions_dir(tpulab_home) / "lesson-1" / "key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    state = json.loads((key.parent / "session.json").read_text())
    assert state["node_name"] == node
    assert state["idle_seconds"] == 600.0
    assert state["deadline_at"] - state["started_at"] == 3600.0
    row = Journal().get(state["run_id"])
    assert row is not None
    assert row.teardown is None
    assert row.phase == "session"

    # The name may be omitted with exactly one session up; the command runs on the VM.
    shell = tpulab("ssh", "--", "echo", "ok", "from", "$(hostname)", timeout=60)
    assert shell.returncode == EXIT_OK, shell.stderr
    assert shell.stdout.startswith("ok from")
    renewed = json.loads((key.parent / "session.json").read_text())["renewed_at"]
    assert renewed > state["renewed_at"]
    # The remote command's own exit status comes back.
    failing = tpulab("ssh", "lesson-1", "--", "sh", "-c", "exit 7", timeout=60)
    assert failing.returncode == 7, failing.stderr
    # One argument is a command line for the remote shell, as with OpenSSH (it once ran
    # 'cd / && pwd' as a program's name: exit 127); several stay words, each quoted.
    compound = tpulab("ssh", "lesson-1", "--", "cd / && pwd", timeout=60)
    assert (compound.returncode, compound.stdout) == (EXIT_OK, "/\n"), compound.stderr
    words = tpulab("ssh", "lesson-1", "--", "echo", "a  b", "$HOME", timeout=60)
    assert (words.returncode, words.stdout) == (EXIT_OK, "a  b $HOME\n"), words.stderr

    where = ("--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE)
    # What `list` shows is counted from the session's own times, read as it ran: not
    # from guesses like "within two minutes of the create", which a loaded machine's
    # slower `up` outlasts (a v5litepod-4 costs ~$0.08 a minute).
    current = json.loads((key.parent / "session.json").read_text())
    before = time.time()
    listed = tpulab("list", *where, timeout=60)
    after = time.time()
    assert listed.returncode == EXIT_OK, listed.stderr
    (line,) = [row for row in listed.stdout.splitlines() if row.startswith("lesson-1 ")]
    assert node in line
    assert "v5litepod-4" in line
    deadline_in, idle_in = [_seconds(word) for word in line.split() if _DURATION.fullmatch(word)]
    assert current["deadline_at"] - after - 1 <= deadline_in <= current["deadline_at"] - before
    idle_at = current["renewed_at"] + current["idle_seconds"]  # after the last `ssh`
    assert idle_at - after - 1 <= idle_in <= idle_at - before
    (cost,) = [float(word[2:]) for word in line.split() if word.startswith("~$")]
    price = lookup("v5litepod-4").price_per_hour(spot=False)
    low, high = (price * (t - current["started_at"]) / 3600 for t in (before, after))
    assert low - 0.005 <= cost <= high + 0.005, (low, cost, high)
    assert "session(s) up; cost so far" in listed.stdout
    as_json = tpulab("list", "--json", *where, timeout=60)
    after_json = time.time()
    assert as_json.returncode == EXIT_OK, as_json.stderr
    (session,) = json.loads(as_json.stdout)["sessions"]
    assert session["name"] == "lesson-1"
    assert session["node_name"] == node
    assert session["accelerator_type"] == "v5litepod-4"
    # Rounded to 0.1 s and to 4 decimals of a dollar.
    json_deadline_in = session["deadline_in_seconds"]
    assert (
        current["deadline_at"] - after_json - 0.1
        <= json_deadline_in
        <= current["deadline_at"] - after + 0.1
    )
    cost_by_then = price * (after_json - current["started_at"]) / 3600
    assert low - 0.0001 <= session["estimated_cost_usd"] <= cost_by_then + 0.0001

    # SSH fails while the node is still there (a host key that does not match): the
    # API is asked, says the node exists where it was, and the mismatch is named.
    state_file = key.parent / "session.json"
    good = state_file.read_text()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )  # a valid ed25519 key, not the node's
    state_file.write_text(good.replace(state["host_key_b64"], other.decode().split()[1]))
    unreachable = tpulab("ssh", "lesson-1", "--", "true", timeout=60)
    assert unreachable.returncode == EXIT_REMOTE
    assert "does not present the host key `up` pinned" in unreachable.stderr
    assert "moved" not in unreachable.stderr
    assert key.exists()
    state_file.write_text(good)

    down = tpulab("down", "lesson-1", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr + down.stdout
    assert "deleted, confirmed by list" in down.stdout
    assert served.node_names(PROJECT) == []
    assert not key.exists()
    assert not key.parent.exists()
    closed = Journal().get(state["run_id"])
    assert closed is not None
    assert closed.teardown == "confirmed"


def test_idle_sessions_delete_themselves_and_ssh_down_list_say_why(
    served: Emulator, tpulab_home: Path
) -> None:
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")
    names = ("idle-ssh", "idle-down", "idle-list")
    _up_at_once(served, *names, extra=("--idle", "30s"))
    states = {name: _state_of(tpulab_home, name) for name in names}
    # Nobody renews the leases: the VMs' watchdogs delete the nodes (30 s + their poll).
    # The 30 s are skipped rather than waited for, on both sides, as test_exec ages a
    # --ttl: each VM's clock moves past its --idle once its watchdog has published up's
    # renewal (one seen only after the move would lapse 30 s of real time later), and
    # each session's recorded times here move back as much, so ssh/down/list judge the
    # lease lapsed too (`why_gone` reads this machine's clock).
    for name, state in states.items():
        node = str(state["node_name"])

        def renewed(node: str = node) -> bool:
            return watchdog_saw_the_last_renewal(served, node)

        wait_until(renewed, f"{node}'s watchdog to read up's last renewal")
        served.skip_vm_clock(PROJECT, ZONE, node, 30)
        _age_session(name, 30, idle_too=True)
    deadline = time.monotonic() + 90
    while served.node_names(PROJECT):
        assert time.monotonic() < deadline, "the idle sessions' nodes were not deleted"
        time.sleep(0.5)
    why = "deleted itself: idle for 30 s (--idle)"

    # ssh cannot reach it, asks the API, says why, cleans up, exits 4.
    shell = tpulab("ssh", "idle-ssh", "--", "true", timeout=60)
    assert shell.returncode == EXIT_REMOTE, shell.stderr
    assert f"Session idle-ssh's node {states['idle-ssh']['node_name']}" in shell.stderr
    assert why in shell.stderr
    assert not (_sessions_dir(tpulab_home) / "idle-ssh").exists()

    down = tpulab("down", "idle-down", timeout=60)
    assert down.returncode == EXIT_OK, down.stderr
    assert f"was already gone (it {why})" in down.stdout
    assert not (_sessions_dir(tpulab_home) / "idle-down").exists()

    where = ("--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE)
    listed = tpulab("list", "--json", *where, timeout=60)
    assert listed.returncode == EXIT_OK, listed.stderr
    assert f"session idle-list's node {states['idle-list']['node_name']} {why}" in listed.stderr
    document = json.loads(listed.stdout)
    assert document["sessions"] == []
    assert [(g["name"], g["cause"]) for g in document["sessions_gone"]] == [("idle-list", "idle")]
    assert list(_sessions_dir(tpulab_home).iterdir()) == []
    for name, state in states.items():
        row = Journal().get(str(state["run_id"]))
        assert row is not None
        assert row.teardown == "confirmed", name
        assert why in row.detail, (name, row.detail)
    again = tpulab("down", "idle-list", timeout=60)
    assert again.returncode == EXIT_CONFIG
    assert "There is no session named 'idle-list'" in again.stderr


def test_a_failing_up_leaves_no_node_and_no_key(served: Emulator, tpulab_home: Path) -> None:
    # The node boots, SSH and the watchdog come up, then the verifier is killed before it
    # writes a receipt (importing jax alone takes longer than 0.1 s; a quiet machine ran
    # the whole verifier inside the 1 s this gave it before): the run's own teardown
    # must delete the node although `up` asked to keep it.
    up = tpulab(*_up(served, "--name", "broken", "--payload-timeout", "0.1", "--json"), timeout=300)
    assert up.returncode != EXIT_OK, up.stdout
    # --json: the failure is the envelope `run --json` prints for it, inside up's.
    envelope = UpEnvelope.model_validate_json(up.stdout)
    assert not envelope.ok
    assert envelope.session is None
    assert envelope.error is not None
    assert envelope.error.exit_status == up.returncode
    assert "verify_tpu.py" in envelope.error.message
    assert "was killed" in envelope.error.message
    assert envelope.run.error == envelope.error
    assert envelope.run.teardown.status == "confirmed"
    assert "Delete VM and confirm" in up.stderr  # the progress, on stderr
    assert "confirmed by list" in up.stderr
    methods = [entry["method"] for entry in served.requests()]
    assert "POST" in methods
    assert "DELETE" in methods
    assert served.node_names(PROJECT) == []
    assert _sessions_dir(tpulab_home).is_dir()
    assert list(_sessions_dir(tpulab_home).iterdir()) == []


def test_down_of_a_missing_session_is_a_clear_error(tpulab_home: Path) -> None:
    done = tpulab("down", "nosuch", timeout=60)
    assert done.returncode == EXIT_CONFIG
    assert "There is no session named 'nosuch'" in done.stderr
    alone = tpulab("ssh", timeout=60)
    assert alone.returncode == EXIT_CONFIG
    assert "No session is up" in alone.stderr


def test_a_ttl_over_a_day_is_refused_before_any_api_call(served: Emulator) -> None:
    done = tpulab(*_up(served, "--ttl", "25h"), timeout=60)
    assert done.returncode == EXIT_CONFIG
    assert "--ttl '25h' is too long: the maximum is 1d." in done.stderr
    assert served.requests() == []


def test_two_sessions_down_one_touches_only_it(served: Emulator, tpulab_home: Path) -> None:
    _up_at_once(served, "one", "two")
    assert len(served.node_names(PROJECT)) == 2
    two = json.loads((_sessions_dir(tpulab_home) / "two" / "session.json").read_text())
    # With two up, the name may not be omitted.
    ambiguous = tpulab("ssh", "--", "true", timeout=60)
    assert ambiguous.returncode == EXIT_CONFIG
    assert "2 sessions are up (one, two): say which." in ambiguous.stderr
    # A second `up` with a name in use is refused before anything is created.
    before = len(served.requests())
    again = tpulab(*_up(served, "--name", "one"), timeout=60)
    assert again.returncode == EXIT_CONFIG
    assert "A session named 'one' already exists." in again.stderr
    assert len(served.requests()) == before

    # A sweep keeps sessions that `up` really made (tests/test_sessions_gone.py has the
    # rest of teardown's session rules, on sessions written directly).
    where = ("--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE)
    kept = tpulab("teardown", "--verify", "--yes", *where, timeout=120)
    assert kept.returncode == EXIT_OK, kept.stderr + kept.stdout
    assert "Kept session one" in kept.stdout
    assert "Kept session two" in kept.stdout
    assert len(served.node_names(PROJECT)) == 2

    down = tpulab("down", "one", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == [two["node_name"]]
    assert (_sessions_dir(tpulab_home) / "two" / "key").is_file()
    done = tpulab("down", "--all", timeout=120)
    assert done.returncode == EXIT_OK, done.stderr
    assert served.node_names(PROJECT) == []
    assert list(_sessions_dir(tpulab_home).iterdir()) == []


def test_ctrl_c_during_down_is_refused_and_down_finishes_what_it_sent(
    served: Emulator, tpulab_home: Path, tmp_path: Path
) -> None:
    up = tpulab(*_up(served, "--name", "brief"), timeout=300)
    assert up.returncode == EXIT_OK, up.stderr + up.stdout
    (node,) = served.node_names(PROJECT)
    served.faults.update({"delete_hangs": True})  # the node stays DELETING until cleared
    stdout = tmp_path / "down.out"
    with stdout.open("w") as sink:  # the child has its own copy of the descriptor
        down = subprocess.Popen(
            [sys.executable, "-m", "tpulab", "down", "brief"],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.PIPE,  # read line by line below, by one reader only
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
    said: list[str] = []
    assert down.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(down.stderr or ()), daemon=True)
    reader.start()
    try:
        wait_until(
            lambda: (
                any("waiting until a list confirms" in line for line in said)
                or down.poll() is not None
            ),
            "down to be waiting for its delete",
            timeout=120,
        )
        assert down.poll() is None, said
        down.send_signal(signal.SIGINT)  # refused, as a run's teardown refuses it
        wait_until(
            lambda: any("SIGINT ignored" in line for line in said) or down.poll() is not None,
            "down to answer the Ctrl-C",
        )
        assert down.poll() is None, said  # the delete still hangs: down cannot be done
        served.faults.update({"delete_hangs": False})
        down.wait(timeout=120)
    finally:
        if down.poll() is None:
            down.kill()
            down.wait()
        reader.join(timeout=10)
        down.stderr.close()
    err = " ".join(" ".join(said).split())
    out = stdout.read_text()
    assert down.returncode == EXIT_OK, out + err
    assert f"Deleting node {node} of session brief; waiting until a list confirms" in err
    assert f"SIGINT ignored: deleting node {node} (session brief); tpulab will exit" in err
    assert "Session brief is down" in out
    assert served.node_names(PROJECT) == []
    assert not (_sessions_dir(tpulab_home) / "brief").exists()


def test_a_down_holding_the_lock_is_named_as_a_down_to_a_second_down_and_an_exec(
    served: Emulator, tpulab_home: Path, tmp_path: Path
) -> None:
    from tpulab.cleanup.sessions import SessionStore
    from tpulab.remote.keys import RunKey
    from tpulab.run.session import exec_lock_for_down

    up = tpulab(*_up(served, "--name", "twice"), timeout=300)
    assert up.returncode == EXIT_OK, up.stderr + up.stdout
    files = SessionStore().resolve("twice")
    key = RunKey.from_openssh_private(files.key_path.read_bytes())
    work = tmp_path / "work"
    work.mkdir()
    # The first `down` between taking the exec lock and its delete: its own lock, taken
    # by its own function over a real connection, held here while the others try.
    with exec_lock_for_down(files.state, key) as first:
        assert first.holder is None
        assert first.unchecked is None
        again = tpulab("down", "twice", timeout=120)
        late = tpulab("exec", "twice", "--workdir", str(work), "--", "true", timeout=120)
    said = " ".join(again.stderr.split())
    assert again.returncode == EXIT_REMOTE, said
    assert "Session twice is being taken down already: another `tpulab down` holds" in said
    assert "an exec holds" not in said  # it was never an exec's
    said = " ".join(late.stderr.split())
    assert late.returncode == EXIT_REMOTE, said
    assert "Session twice is being taken down: `tpulab down` holds its lock" in said
    assert served.node_names(PROJECT) != []  # neither deleted anything
    done = tpulab("down", "twice", timeout=120)
    assert done.returncode == EXIT_OK, done.stderr
    assert served.node_names(PROJECT) == []
