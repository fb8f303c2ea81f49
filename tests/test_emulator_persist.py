"""The emulator's state file: what a transaction writes, and what it must never miss.

A transaction decides whether to write by comparing the state before and after its body;
the "before" side is remembered from this process's last read or write while the file
still holds those bytes. These tests pin the cases that shortcut could get wrong.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tpulab.emulator.persist import EmulatorStateError, StateFile


def _stamp(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_ino, status.st_mtime_ns


def test_a_transaction_that_changes_nothing_leaves_the_file_alone(tmp_path: Path) -> None:
    store = StateFile(tmp_path)
    with store.transaction() as state:
        state["nodes"]["a"] = {"state": "READY"}
    before = _stamp(store.path)
    for _ in range(3):
        with store.transaction() as state:
            assert state["nodes"]["a"] == {"state": "READY"}
    assert _stamp(store.path) == before  # replaced files get a new inode


def test_a_change_back_after_another_process_wrote_is_written(tmp_path: Path) -> None:
    # Two StateFiles on one directory stand for a served emulator and `tpulab list
    # --emulate`. Once the other has written, this one's memory of the file is stale:
    # setting the value it last wrote is a change again, and must reach the file.
    mine, theirs = StateFile(tmp_path), StateFile(tmp_path)
    with mine.transaction() as state:
        state["next_id"] = 5
    with theirs.transaction() as state:
        assert state["next_id"] == 5
        state["next_id"] = 6
    with mine.transaction() as state:
        assert state["next_id"] == 6
        state["next_id"] = 5
    assert theirs.read()["next_id"] == 5


def test_a_body_that_fails_writes_nothing_and_the_next_sees_the_file(tmp_path: Path) -> None:
    store = StateFile(tmp_path)
    with store.transaction() as state:
        state["nodes"]["a"] = {"state": "READY"}

    def fail_half_way() -> None:
        with store.transaction() as state:
            state["nodes"]["a"]["state"] = "DELETING"
            raise RuntimeError("the request failed half-way")

    with pytest.raises(RuntimeError, match="half-way"):
        fail_half_way()
    with store.transaction() as state:
        assert state["nodes"]["a"] == {"state": "READY"}
        state["nodes"]["a"]["state"] = "DELETING"  # the same edit, now completed
    assert StateFile(tmp_path).read()["nodes"]["a"] == {"state": "DELETING"}


def test_a_state_kept_after_its_transaction_cannot_hide_the_next_change(tmp_path: Path) -> None:
    # Each transaction yields its own copy; what the next compares against is the file's
    # content as written, never an object a caller may still hold and change.
    store = StateFile(tmp_path)
    with store.transaction() as kept:
        kept["nodes"]["a"] = {"state": "READY"}
    kept["nodes"]["a"]["state"] = "GONE"  # after its transaction: not the cloud's state
    with store.transaction() as state:
        assert state["nodes"]["a"] == {"state": "READY"}
        state["nodes"]["a"]["state"] = "GONE"  # now it is, and must be written
    assert StateFile(tmp_path).read()["nodes"]["a"] == {"state": "GONE"}


def test_no_state_file_is_a_fresh_cloud_and_reading_it_creates_none(tmp_path: Path) -> None:
    state = StateFile(tmp_path)
    assert state.read()["nodes"] == {}
    assert not state.path.exists()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param(b"", "is empty.", id="empty"),
        pytest.param(b"\n  \n", "is empty.", id="blank"),
        pytest.param(b'{"nodes": {"\xff": {}}}', "is not valid JSON ('utf-8' codec", id="not-utf8"),
    ],
)
def test_an_empty_or_undecodable_state_file_is_damage_not_a_fresh_cloud(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    """Every write replaces state.json whole, so an empty one is damage (a crash before
    its blocks reached the disk): starting afresh would forget its nodes silently."""
    state = StateFile(tmp_path)
    state.path.write_bytes(content)
    with pytest.raises(EmulatorStateError) as refused:
        state.read()
    assert refused.value.message.startswith(f"The emulator state file {state.path} {problem}")
    assert refused.value.hint is not None
    assert refused.value.hint.startswith(f"Move {state.path}")
    assert state.path.read_bytes() == content  # the damage is left for the user to see
