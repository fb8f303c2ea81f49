"""Damaged session state files (issue 20, defect 6): a session.json that is empty, not
an object, half an object, truncated, of the wrong types or not UTF-8 used to break
`list`, `ssh`, `exec` and `down` for every session. Now it is named in a warning, set
aside (moved, never deleted) and hides no other session; its node is left to
`tpulab teardown --verify`. Real `up`, real OpenSSH, a served emulator; nothing mocked."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import invoke, require_tool, served_emulator, tpulab

from tpulab.cleanup.sessions import DAMAGED_DIR, SessionStore
from tpulab.emulator import Emulator
from tpulab.errors import ConfigError, StateFileError
from tpulab.run.session_state import SessionState

PROJECT = "state-proj"
ZONE = "us-central1-a"
EXIT_OK = 0
EXIT_LOCAL_STATE = 8
EXIT_CONFIG = 2

GOOD: dict[str, object] = {
    "name": "c1", "run_id": "20261201t000000-abcdef", "node_name": "tpulab-c1", "zone": ZONE,
    "project": PROJECT, "api_endpoint": None, "accelerator_type": "v5litepod-4",
    "spot": False, "ssh_user": "tpulab", "ssh_host": "127.0.0.1", "ssh_port": 22,
    "host_key_type": "ssh-ed25519", "host_key_b64": "AAAA",
    "watchdog": {
        "run_id": "20261201t000000-abcdef", "node_name": "tpulab-c1", "zone": ZONE,
        "project": PROJECT, "lease_seconds": 60.0, "boot_grace_seconds": 60.0,
        "max_duration_seconds": 600.0,
    },
    "started_at": 1.0, "deadline_at": 601.0, "idle_seconds": 60.0, "renewed_at": 1.0,
}  # fmt: skip


def _damaged_forms(good: str) -> dict[str, bytes]:
    """The damaged forms of a good session.json, and what the warning says of each."""
    broken = json.loads(good)
    return {
        "empty": b"",
        "a list": b"[]",
        "null": b"null",
        "only a name": b'{"name": "c1"}',
        "truncated": good.encode()[: len(good) // 2],
        "wrong types": json.dumps({**broken, "ssh_port": "22", "deadline_at": "soon"}).encode(),
        "not UTF-8": b"\xff\xfe{\x00",
        "another name": json.dumps({**broken, "name": "c9"}).encode(),
        "no watchdog": json.dumps({**broken, "watchdog": {}}).encode(),
    }


WHY = {
    "empty": "the file is empty",
    "a list": "not a JSON object",
    "null": "not a JSON object",
    "only a name": "fields missing: run_id, node_name, zone and 14 more",
    "truncated": "Invalid JSON",
    "wrong types": "ssh_port: Input should be a valid integer (and 1 more)",
    "not UTF-8": "Invalid JSON",
    "another name": "it names another session ('c9')",
    "no watchdog": "its watchdog settings are incomplete",
}
FORMS = tuple(WHY)


def _write_session(root: Path, name: str, content: bytes) -> Path:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "key").write_bytes(b"the key")
    (directory / "session.json").write_bytes(content)
    return directory


def _good(name: str) -> bytes:
    return json.dumps({**GOOD, "name": name, "run_id": f"20261201t000000-{name}"}).encode()


@pytest.mark.parametrize("form", FORMS)
def test_a_damaged_state_is_set_aside_named_and_hides_no_other(tmp_path: Path, form: str) -> None:
    root = tmp_path / "sessions"
    _write_session(root, "c0", _good("c0"))
    _write_session(root, "c1", _damaged_forms(_good("c1").decode())[form])
    _write_session(root, "c2", _good("c2"))
    # Teardown and costs only read: the damaged one is left out, and left in place.
    assert sorted(s.name for s in SessionStore(root).by_run_id().values()) == ["c0", "c2"]
    assert (root / "c1" / "session.json").exists()

    store = SessionStore(root, clock=lambda: 1764806400.0)  # 2025-12-04 00:00 UTC
    assert [files.state.name for files in store.all()] == ["c0", "c2"]
    [damaged] = store.damaged
    moved = root / DAMAGED_DIR / "c1-20251204T000000Z"
    assert (damaged.name, damaged.moved_to) == ("c1", moved)
    assert WHY[form] in damaged.why
    assert damaged.message == (
        f"session c1's state file {root / 'c1' / 'session.json'} is damaged: {damaged.why}; "
        f"set aside as {moved}; its node, if any, is still found by "
        "`tpulab teardown --verify`."
    )
    # Set aside, not deleted: the state and the key are kept, out of the sessions' way.
    assert not (root / "c1").exists()
    assert (moved / "key").read_bytes() == b"the key"
    assert store.names() == ["c0", "c2"]


@pytest.mark.parametrize("form", ["empty", "truncated", "wrong types"])
def test_loading_a_damaged_session_by_name_is_a_state_file_error(tmp_path: Path, form: str) -> None:
    root = tmp_path / "sessions"
    _write_session(root, "c1", _damaged_forms(_good("c1").decode())[form])
    _write_session(root, "c2", _good("c2"))
    store = SessionStore(root)
    with pytest.raises(StateFileError, match=r"Session c1's state file .* is damaged: "):
        store.load("c1")
    # With it set aside, the one session left is the one `ssh`/`exec` without a name use.
    assert store.resolve(None).state.name == "c2"


def test_a_missing_session_is_told_where_its_own_damaged_state_went(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / DAMAGED_DIR / "lab-2-20261207T111548Z").mkdir(parents=True)
    (root / DAMAGED_DIR / "lab-notes").mkdir()  # not a set-aside name: never matched
    store = SessionStore(root)
    # "lab" is not "lab-2": its hint is the plain one, not lab-2's set-aside state.
    with pytest.raises(ConfigError) as lab:
        store.load("lab")
    assert "set aside" not in (lab.value.hint or "")
    with pytest.raises(ConfigError) as lab2:
        store.load("lab-2")
    assert f"set aside as {root / DAMAGED_DIR / 'lab-2-20261207T111548Z'}" in (
        lab2.value.hint or ""
    )
    assert "`tpulab teardown --verify`" in (lab2.value.hint or "")


def test_a_good_state_still_loads_as_before() -> None:
    state = SessionState.from_json(json.dumps(GOOD))
    assert (state.ssh_port, state.started_at) == (22, 1.0)
    assert SessionState.from_json(state.to_json()) == state


# -- the commands, as a user runs them --------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def _sessions() -> Path:
    return Path(os.environ["TPULAB_HOME"]) / "state" / "sessions"


def _up(emulator: Emulator, name: str) -> None:
    done = tpulab(
        "up", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        "--project", PROJECT, "--zone", ZONE, "--boot-timeout", "30", "--name", name,
        "--ttl", "1h", "--idle", "30m", timeout=300,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout


def _damage(saved: Path, content: bytes) -> None:
    """c1 damaged again: its directory back from where the last command set it aside
    (the key with it), its session.json replaced by `content`."""
    shutil.rmtree(_sessions() / DAMAGED_DIR, ignore_errors=True)
    shutil.rmtree(_sessions() / "c1", ignore_errors=True)  # a command refused to move it
    shutil.copytree(saved, _sessions() / "c1")
    (_sessions() / "c1" / "session.json").write_bytes(content)


def _said(stderr: str, form: str) -> str:
    said = " ".join(stderr.split())
    assert "session c1's state file" in said.lower(), said
    assert f"is damaged: {WHY[form]}" in said, said
    assert "its node, if any, is still found by `tpulab teardown --verify`" in said
    return said


def test_every_command_survives_each_damaged_form_and_the_other_session_works(
    served: Emulator, tmp_path: Path
) -> None:
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")  # `tpulab ssh`
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda name: _up(served, name), ["c1", "c2"]))
    saved = tmp_path / "c1-saved"
    shutil.copytree(_sessions() / "c1", saved)
    c1_node = json.loads((saved / "session.json").read_text())["node_name"]
    where = ("--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE)
    forms = _damaged_forms((saved / "session.json").read_text())
    # In this process (`invoke`: a crash is re-raised, never read as a status), for speed:
    # every command with every form.
    for form, content in forms.items():
        _damage(saved, content)
        status, out, err = invoke("list", "--json", *where)
        assert status == EXIT_OK, f"{form}: {err}"
        _said(err, form)
        assert [s["name"] for s in json.loads(out)["sessions"]] == ["c2"], form
        assert not (_sessions() / "c1").exists()
        assert [p.name.split("-")[0] for p in (_sessions() / DAMAGED_DIR).iterdir()] == ["c1"]

        for argv in (
            ("ssh", "c1", "--", "true"),
            ("exec", "c1", "--dry-run", "--", "true"),
            ("down", "c1"),
        ):
            _damage(saved, content)
            status, _, err = invoke(*argv)
            assert status == EXIT_LOCAL_STATE, f"{form} {argv}: {err}"
            said = _said(err, form)
            assert said.count("is damaged") == 1, said  # the error, not a warning as well

        # Without a name, the one readable session is the one used, with a warning.
        _damage(saved, content)
        status, _, err = invoke("ssh", "--", "true")
        assert status == EXIT_OK, f"{form}: {err}"
        _said(err, form)
        assert c1_node in served.node_names(PROJECT)  # nothing was deleted on its account

    # A real exec on the readable session, past a damaged one (a subprocess, as typed).
    _damage(saved, forms["truncated"])
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("print('hello')\n")
    ran = tpulab(
        "exec", "--workdir", str(work), "--out", str(tmp_path / "out"), "--",
        "python", "hello.py", timeout=300,
    )  # fmt: skip
    assert ran.returncode == EXIT_OK, ran.stderr + ran.stdout
    assert "hello" in ran.stdout
    _said(ran.stderr, "truncated")

    # `down --all` ends the readable one; the damaged one's node is teardown's to find.
    _damage(saved, forms["null"])
    down_all = tpulab("down", "--all", timeout=120)
    assert down_all.returncode == EXIT_OK, down_all.stderr
    assert "Session c2 is down" in down_all.stdout
    _said(down_all.stderr, "null")
    assert served.node_names(PROJECT) == [c1_node]
    # Set aside, c1 is no session `down` can end: list and down say what deletes it.
    status, out, err = invoke("list", "--json", *where)
    assert status == EXIT_OK, err
    (listed,) = [n for n in json.loads(out)["nodes"] if n["name"] == c1_node]
    assert listed["journal"] == (
        "session whose state is gone: `tpulab teardown --verify` deletes it"
    )
    status, _, err = invoke("down", "c1")
    assert status == EXIT_CONFIG, err
    assert "There is no session named 'c1'." in err
    assert "Its state was damaged and set aside as " in err
    assert "its node, if it still exists, is deleted by `tpulab teardown --verify`" in err
    swept = tpulab("teardown", "--verify", "--yes", *where, timeout=120)
    assert swept.returncode == EXIT_OK, swept.stderr + swept.stdout
    assert served.node_names(PROJECT) == []
