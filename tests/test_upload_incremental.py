"""The second upload sends only what changed, over real SSH on BOTH host backends (the
embedded asyncssh server and OpenSSH's sshd): the real paramiko Connection, the real
transfer script on the emulated host, the host's disk (its sandbox) checked directly.

What is on the VM is asked of the VM each time (its manifest is hashed there from the
files), so a file the user's command changed is sent again, and a kept file that changes
between that question and the unpack is refused rather than kept stale."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pytest
from helpers import snapshot, write_tree

from tpulab.errors import RemoteError
from tpulab.remote.bootstrap import CommandResult
from tpulab.remote.ssh import Connection
from tpulab.remote.workspace import UploadResult, select_workspace, upload_workspace
from tpulab.run.outcome import WorkloadOutcome
from tpulab.run.record import workload_summary

if TYPE_CHECKING:
    from ssh_fixtures import SshHost

pytest_plugins = ["ssh_fixtures"]

TREE = {
    "train.py": b"import jax\nprint(jax.devices())\n",
    "lab/model.py": b"W = 3\n" * 5000,
    "lab/data.bin": os.urandom(2 * 2**20 + 3),  # several chunks, not a block multiple
    "lab/old.py": b"to be deleted",
    "notes/readme.md": b"# notes\n",
}


def _modes(root: Path) -> dict[str, tuple[int, int]]:
    """Each file's permission bits and whole-second mtime (what a full upload sets)."""
    found: dict[str, tuple[int, int]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            status = path.stat()
            rel = path.relative_to(root).as_posix()
            found[rel] = (stat.S_IMODE(status.st_mode), int(status.st_mtime))
    return found


def _upload(conn: Connection, root: Path) -> UploadResult:
    return upload_workspace(conn, select_workspace(root), "work", timeout=60)


def test_an_unchanged_second_upload_sends_no_file_bytes_and_keeps_the_tree(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    root = write_tree(tmp_path / "ws", TREE)
    os.chmod(root / "train.py", 0o755)
    on_vm = ssh_host.sandbox / "work"
    with ssh_host.connect() as conn:
        first = _upload(conn, root)
        tree, modes = snapshot(on_vm), _modes(on_vm)
        second = _upload(conn, root)
    assert first.sent == first.manifest  # a fresh VM holds nothing: everything went
    assert first.unchanged == 0
    assert first.wire_bytes > sum(len(data) for data in TREE.values())
    assert second.sent.count == 0
    assert second.sent.total_bytes == 0
    assert second.manifest == first.manifest
    assert (second.unchanged, second.removed) == (len(TREE), 0)
    # The archive holds only the keep list (~150 bytes a file), end blocks and trailer.
    assert second.wire_bytes < 4096 + 200 * len(TREE)
    assert second.describe() == f"0 of {len(TREE)} files sent (0 B); {len(TREE)} unchanged"
    assert snapshot(on_vm) == tree == TREE  # byte-identical, on the host's own disk
    assert _modes(on_vm) == modes  # the exec bit and mtimes too, as a full upload sets them
    assert modes["train.py"][0] == 0o755
    assert _staging_left(ssh_host.sandbox) == []


def test_one_changed_one_added_one_deleted_send_and_remove_exactly_those(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    root = write_tree(tmp_path / "ws", TREE)
    with ssh_host.connect() as conn:
        _upload(conn, root)
        (root / "lab/model.py").write_bytes(b"W = 4\n" * 5000)  # same size, new content
        (root / "lab/old.py").unlink()
        (root / "lab/new.py").write_bytes(b"added")
        os.chmod(root / "notes/readme.md", 0o755)  # a mode change alone is not a resend
        result = _upload(conn, root)
    assert sorted(entry.path for entry in result.sent.entries) == ["lab/model.py", "lab/new.py"]
    assert result.sent.total_bytes == len(b"W = 4\n" * 5000) + len(b"added")
    assert (result.unchanged, result.removed) == (3, 1)
    assert result.describe() == "2 of 5 files sent (29.3 KiB); 3 unchanged; 1 removed"
    on_vm = ssh_host.sandbox / "work"
    assert snapshot(on_vm) == snapshot(root)
    assert result.manifest.count == 5
    assert {e.path: e.sha256 for e in result.manifest.entries} == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in snapshot(root).items()
    }
    assert os.access(on_vm / "notes/readme.md", os.X_OK)  # the keep list carries the mode
    # run.json and `run --json` keep the whole manifest and add what was sent.
    outcome = WorkloadOutcome(command=("python",), env_names=(), out=tmp_path, upload=result)
    summary = workload_summary(outcome)
    assert (summary.upload_files, summary.upload_sent_files) == (5, 2)
    assert summary.upload_sent_bytes == result.sent.total_bytes
    assert (summary.upload_unchanged, summary.upload_removed) == (3, 1)
    assert summary.upload_wire_bytes == result.wire_bytes


def test_a_file_changed_on_the_vm_between_uploads_is_sent_again(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    root = write_tree(tmp_path / "ws", TREE)
    on_vm = ssh_host.sandbox / "work"
    with ssh_host.connect() as conn:
        _upload(conn, root)
        # What a user's command may do: rewrite a file in place, same size, and even put
        # its mtime back. A manifest remembered (or cached by size and mtime) would keep it.
        target = on_vm / "lab/data.bin"
        before = target.stat()
        with target.open("r+b") as handle:
            handle.write(b"\0" * 64)
        os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
        (on_vm / "scratch.txt").write_bytes(b"left by the command")
        result = _upload(conn, root)
        aside = snapshot(ssh_host.sandbox / "replaced")
    assert [entry.path for entry in result.sent.entries] == ["lab/data.bin"]
    # What the command wrote stays (a session's next exec finds it); the file a sync put
    # there is the laptop's again, the VM's bytes kept aside rather than lost.
    assert (result.unchanged, result.removed, result.carried) == (len(TREE) - 1, 0, 1)
    assert snapshot(on_vm) == {**TREE, "scratch.txt": b"left by the command"}
    assert result.replaced == ("lab/data.bin",)
    ((name, data),) = aside.items()
    assert name.endswith("/lab/data.bin")
    assert data[:64] == b"\0" * 64


def _staging_left(home: Path) -> list[str]:
    """The unpack's staging and old copies (`.work.tpulab-new-PID`, `-old-PID`) still in
    `home`; its record of what it placed (`.work.tpulab-synced.json`) is meant to stay."""
    return [p.name for p in home.iterdir() if ".tpulab-new-" in p.name or ".tpulab-old-" in p.name]


class ChangesKeptFileBeforeUnpack:
    """A StreamShell over a real Connection that, when the unpack is about to run (after
    the manifest was read and the diff made), rewrites a file on the VM's disk, as a
    process still running there would."""

    def __init__(self, conn: Connection, victim: Path) -> None:
        self.conn = conn
        self.victim = victim
        self.unpacks: list[list[str]] = []

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        if argv[3] == "unpack":
            self.unpacks.append(list(argv))
            data = bytearray(self.victim.read_bytes())
            data[0] ^= 0xFF
            self.victim.write_bytes(bytes(data))
        return self.conn.run_streaming(argv, stdin=stdin, stdout=stdout, timeout=timeout, env=env)


def test_a_kept_file_that_changes_before_the_unpack_is_refused(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    root = write_tree(tmp_path / "ws", TREE)
    on_vm = ssh_host.sandbox / "work"
    with ssh_host.connect() as conn:
        _upload(conn, root)
        (root / "train.py").write_bytes(b"print('changed')\n")  # so something is sent
        tampering = ChangesKeptFileBeforeUnpack(conn, on_vm / "lab/model.py")
        with pytest.raises(RemoteError, match=r"lab/model\.py' changed on the VM after"):
            upload_workspace(tampering, select_workspace(root), "work", timeout=60)
        assert tampering.unpacks
        assert tampering.unpacks[0][-1] == "--keep"
        # Nothing was replaced: the VM still holds its previous copy (the changed file
        # included), and no staging directory is left behind.
        assert snapshot(on_vm)["train.py"] == TREE["train.py"]
        assert snapshot(on_vm)["lab/model.py"] != TREE["lab/model.py"]
        assert _staging_left(ssh_host.sandbox) == []
        # The next upload asks again, sees the change, and sends that file too.
        result = _upload(conn, root)
    assert sorted(e.path for e in result.sent.entries) == ["lab/model.py", "train.py"]
    assert snapshot(on_vm) == snapshot(root)
