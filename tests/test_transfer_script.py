"""remote_payloads/transfer.py run for real under the image's Python 3.10, as a local
subprocess (the VM's half), driven by the controller's half in tpulab.remote.workspace
through a StreamShell that runs argv on this machine."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

import pytest
from helpers import require_python, snapshot, write_tree

from tpulab.errors import RemoteError, WorkspaceError
from tpulab.remote.manifest import LeftBehind
from tpulab.remote.workspace import (
    UploadResult,
    fetch_artifacts,
    manifest_command,
    remote_manifest,
    select_workspace,
    transfer_source,
    unpack_command,
    upload_workspace,
)


def python310() -> str:
    """The interpreter TPU VM images ship."""
    return require_python("3.10")


@dataclass(frozen=True)
class Result:
    exit_status: int
    stdout: str
    stderr: str


class LocalShell:
    """A StreamShell whose 'VM' is a subprocess on this machine, started in `home`."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.argv: list[list[str]] = []

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> Result:
        self.argv.append(list(argv))
        process = subprocess.Popen(
            list(argv),
            cwd=self.home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "HOME": str(self.home), **(env or {})},
        )
        assert process.stdin
        assert process.stdout
        assert process.stderr
        errors: list[BaseException] = []

        def feed() -> None:
            assert process.stdin
            try:
                assert stdin is None or isinstance(stdin, Iterable)  # the transfers' kind
                for chunk in stdin or ():
                    process.stdin.write(chunk)
            except BrokenPipeError:
                pass
            except BaseException as exc:  # re-raised below, as a real shell would
                errors.append(exc)
            finally:
                with contextlib.suppress(BrokenPipeError):
                    process.stdin.close()

        feeder = threading.Thread(target=feed)
        feeder.start()
        while chunk := process.stdout.read(1 << 16):
            if stdout is not None:
                stdout.write(chunk)
        stderr = process.stderr.read().decode()
        process.wait(timeout)
        feeder.join()
        if errors:
            raise errors[0]
        return Result(process.returncode, "", stderr)


FILES = {
    "train.py": b"print('hi')\n",
    "pkg/__init__.py": b"",
    "pkg/deep/model.py": b"W = 1\n" * 1000,
    "data/blob.bin": os.urandom(3 * 2**20 + 17),  # several chunks, not a block multiple
    "odd name's $(x).txt": b"quoted",
    "ümlaut/ß.txt": b"unicode",
    "long/" + "d" * 120 + "/" + "f" * 120: b"a PAX long name",
}


@pytest.mark.parametrize("gzip", [False, True], ids=["tar", "tar.gz"])
def test_upload_then_fetch_round_trip_is_byte_identical(tmp_path: Path, gzip: bool) -> None:
    python = python310()
    root = write_tree(tmp_path / "ws", FILES)
    os.chmod(root / "train.py", 0o755)
    home = tmp_path / "home"
    home.mkdir()
    shell = LocalShell(home)
    selection = select_workspace(root)
    sent = upload_workspace(
        shell, selection, "work/ws", timeout=60, python=python, gzip=gzip
    ).manifest
    assert snapshot(home / "work/ws") == FILES
    assert os.access(home / "work/ws/train.py", os.X_OK)
    assert {entry.path: entry.sha256 for entry in sent.entries} == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in FILES.items()
    }

    run_dir = write_tree(home / "run", {"ckpt/step_1.npz": os.urandom(200_000), "m.jsonl": b"{}\n"})
    (home / "cmd.log").write_bytes(b"line 1\nline 2\n")
    out = tmp_path / "out"
    got = fetch_artifacts(
        shell,
        workspace="work/ws",
        patterns=["pkg/**/*.py", "data", "nothing-*", "absent/**"],
        run_dir=str(run_dir),
        log_path="~/cmd.log",
        out=out,
        timeout=60,
        python=python,
        gzip=gzip,
    )
    expected = {
        "workspace/pkg/__init__.py": FILES["pkg/__init__.py"],
        "workspace/pkg/deep/model.py": FILES["pkg/deep/model.py"],
        "workspace/data/blob.bin": FILES["data/blob.bin"],
        "run/ckpt/step_1.npz": (run_dir / "ckpt/step_1.npz").read_bytes(),
        "run/m.jsonl": b"{}\n",
        "cmd.log": b"line 1\nline 2\n",
    }
    on_disk = snapshot(out)
    manifest = json.loads(on_disk.pop("manifest.json"))
    assert on_disk == expected
    assert got.missing == ("nothing-*", "absent/**")
    assert manifest["missing"] == ["nothing-*", "absent/**"]
    assert {e["path"]: e["sha256"] for e in manifest["files"]} == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in expected.items()
    }
    assert not [p for p in out.iterdir() if p.name.startswith(".tpulab")]  # no staging left


def test_a_second_upload_replaces_the_previous_content(tmp_path: Path) -> None:
    python = python310()
    home = tmp_path / "home"
    home.mkdir()
    shell = LocalShell(home)
    first = write_tree(tmp_path / "v1", {"old.py": b"1", "keep.py": b"v1"})
    upload_workspace(shell, select_workspace(first), "ws", timeout=60, python=python)
    second = write_tree(tmp_path / "v2", {"keep.py": b"v2", "new.py": b"2"})
    upload_workspace(shell, select_workspace(second), "ws", timeout=60, python=python)
    assert snapshot(home / "ws") == {"keep.py": b"v2", "new.py": b"2"}
    # No staging or old copy left; the record of what the sync placed, beside it.
    assert sorted(p.name for p in home.iterdir()) == [".ws.tpulab-synced.json", "ws"]


def test_a_sync_keeps_what_commands_wrote_and_removes_what_the_laptop_deleted(
    tmp_path: Path,
) -> None:
    """A session's exec writes checkpoints into its workspace and the next exec resumes
    from them: its sync must not remove them, while a file the laptop deleted goes."""
    python = python310()
    home = tmp_path / "home"
    home.mkdir()
    shell = LocalShell(home)
    laptop = write_tree(tmp_path / "laptop", {"train.py": b"v1", "old.py": b"o", "lib/u.py": b"u"})
    upload_workspace(shell, select_workspace(laptop), "ws", timeout=60, python=python)
    # The command: a checkpoint, a link to it, a FIFO, a file where the laptop will
    # put a directory, and train.py rewritten (the laptop's copy still wins).
    ws = home / "ws"
    write_tree(ws, {"ckpt/step_5.npz": b"c" * 5000, "clash": b"mine", "train.py": b"edited"})
    os.symlink("ckpt/step_5.npz", ws / "latest")
    os.mkfifo(ws / "pipe")
    ckpt_inode = (ws / "ckpt/step_5.npz").stat().st_ino
    # The VM lists only what the sync placed: a command's gigabytes are never hashed.
    listed = remote_manifest(shell, "ws", timeout=60, python=python)
    assert [entry.path for entry in listed.entries] == ["lib/u.py", "old.py", "train.py"]
    (laptop / "old.py").unlink()
    write_tree(laptop, {"clash/x.py": b"x"})
    result = upload_workspace(shell, select_workspace(laptop), "ws", timeout=60, python=python)
    assert snapshot(ws) == {
        "train.py": b"v1",
        "lib/u.py": b"u",
        "clash/x.py": b"x",
        "ckpt/step_5.npz": b"c" * 5000,
        "latest": b"c" * 5000,  # read through the link
    }
    assert os.readlink(ws / "latest") == "ckpt/step_5.npz"
    assert stat.S_ISFIFO(os.lstat(ws / "pipe").st_mode)
    assert (ws / "ckpt/step_5.npz").stat().st_ino == ckpt_inode  # linked, never copied
    assert (result.removed, result.carried) == (1, 3)  # old.py; ckpt, latest, pipe
    assert result.carried_bytes == 5000 + len("ckpt/step_5.npz")
    assert "; 1 removed; 3 written by earlier commands kept (" in result.describe()
    # What the command wrote stays the command's: the next sync keeps it again.
    again = upload_workspace(shell, select_workspace(laptop), "ws", timeout=60, python=python)
    assert (again.sent.count, again.removed, again.carried) == (0, 0, 3)
    assert (ws / "ckpt/step_5.npz").read_bytes() == b"c" * 5000


def test_a_synced_file_edited_on_the_vm_is_set_aside_before_the_laptops_replaces_it(
    tmp_path: Path,
) -> None:
    """A notebook saved by Jupyter on the VM (or a file edited over VS Code's SSH) and
    then synced over from the laptop: the laptop's copy wins, as it always has, but the
    VM's hour of work is kept where no sync reaches, and the sync says where."""
    python = python310()
    home = tmp_path / "home"
    home.mkdir()
    shell = LocalShell(home)
    files = {"lab.ipynb": b"{laptop 1}", "notes.md": b"n", "same.py": b"s", "gone.py": b"g"}
    laptop = write_tree(tmp_path / "laptop", files)
    upload_workspace(shell, select_workspace(laptop), "ws", timeout=60, python=python)
    ws = home / "ws"
    # On the VM: the notebook and gone.py edited; notes.md rewritten with its own bytes.
    write_tree(ws, {"lab.ipynb": b"{an hour of work}", "gone.py": b"g2", "notes.md": b"n"})
    # On the laptop: the notebook edited too, gone.py deleted, same.py as it was.
    write_tree(laptop, {"lab.ipynb": b"{laptop 2}"})
    (laptop / "gone.py").unlink()
    result = upload_workspace(shell, select_workspace(laptop), "ws", timeout=60, python=python)
    assert snapshot(ws) == {"lab.ipynb": b"{laptop 2}", "notes.md": b"n", "same.py": b"s"}
    assert (result.replaced_count, result.replaced) == (2, ("gone.py", "lab.ipynb"))
    # Beside the workspace, not in it; named from the login's home, as the user types it.
    assert result.replaced_dir is not None
    assert result.replaced_dir.startswith("~/replaced/")
    aside = home / result.replaced_dir.removeprefix("~/")
    assert snapshot(aside) == {"lab.ipynb": b"{an hour of work}", "gone.py": b"g2"}
    assert result.describe_replaced() == (
        "2 files changed on the VM since the last sync were replaced by the laptop's; the "
        f"VM's copies are in {result.replaced_dir} on the VM: gone.py, lab.ipynb"
    )
    assert "replaced" not in result.describe()  # said apart, as a warning
    # Nothing changed on the VM since: the next sync sets nothing aside.
    write_tree(laptop, {"lab.ipynb": b"{laptop 3}"})
    again = upload_workspace(shell, select_workspace(laptop), "ws", timeout=60, python=python)
    assert (again.replaced_count, again.replaced_dir, again.describe_replaced()) == (0, None, "")
    assert (ws / "lab.ipynb").read_bytes() == b"{laptop 3}"


def test_a_workspace_synced_before_records_keeps_everything_once(tmp_path: Path) -> None:
    """A session an older tpulab synced has no record, so no telling the laptop's files
    from the commands': the first sync keeps whatever it does not replace (a file the
    laptop deleted stays, once), and records; from then on the laptop's deletions go."""
    python = python310()
    home = tmp_path / "home"
    write_tree(home / "ws", {"a.py": b"a", "stray.txt": b"s"})  # no record beside it
    laptop = write_tree(tmp_path / "laptop", {"a.py": b"a"})
    result = upload_workspace(shell := LocalShell(home), select_workspace(laptop), "ws",
                              timeout=60, python=python)  # fmt: skip
    assert (result.removed, result.carried) == (0, 1)
    assert snapshot(home / "ws") == {"a.py": b"a", "stray.txt": b"s"}
    write_tree(home / "ws", {"out.txt": b"o"})
    write_tree(laptop, {"b.py": b"b"})
    result = upload_workspace(shell, select_workspace(laptop), "ws", timeout=60, python=python)
    assert (result.removed, result.carried) == (0, 2)
    assert snapshot(home / "ws") == {"a.py": b"a", "b.py": b"b", "stray.txt": b"s", "out.txt": b"o"}
    (laptop / "b.py").unlink()
    result = upload_workspace(shell, select_workspace(laptop), "ws", timeout=60, python=python)
    assert (result.removed, result.carried) == (1, 2)
    assert snapshot(home / "ws") == {"a.py": b"a", "stray.txt": b"s", "out.txt": b"o"}


def _archive(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    raw = buffer.getvalue()
    return raw + b"TPULAB-ARCHIVE-SHA256:" + hashlib.sha256(raw).hexdigest().encode()


def _unpack(
    python: str, home: Path, stream: bytes, *flags: str
) -> subprocess.CompletedProcess[bytes]:
    argv = [*unpack_command("ws", python=python), *flags]
    return subprocess.run(argv, cwd=home, input=stream, capture_output=True, timeout=60)


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize("gzip", [False, True], ids=["tar", "tar.gz"])
def test_a_second_upload_sends_only_what_changed_under_python310(
    tmp_path: Path, gzip: bool
) -> None:
    python = python310()
    home = tmp_path / "home"
    home.mkdir()
    shell = LocalShell(home)
    root = write_tree(tmp_path / "ws", FILES)

    def upload() -> UploadResult:
        return upload_workspace(
            shell, select_workspace(root), "work/ws", timeout=60, python=python, gzip=gzip
        )

    first = upload()
    again = upload()
    assert (first.sent.count, first.unchanged) == (len(FILES), 0)
    assert (again.sent.count, again.sent.total_bytes, again.unchanged) == (0, 0, len(FILES))
    assert snapshot(home / "work/ws") == FILES
    (root / "pkg/__init__.py").write_bytes(b"VERSION = 2\n")
    (root / "data/blob.bin").unlink()
    changed = upload()
    assert [entry.path for entry in changed.sent.entries] == ["pkg/__init__.py"]
    assert (changed.unchanged, changed.removed) == (len(FILES) - 2, 1)
    assert snapshot(home / "work/ws") == snapshot(root)
    # Each upload asked the VM first; only the ones with something to keep say --keep.
    verbs = [argv[3:] for argv in shell.argv]
    flags = ["--gzip"] if gzip else []
    assert verbs == [
        ["manifest", "work/ws"],
        ["unpack", "work/ws", *flags],
        ["manifest", "work/ws"],
        ["unpack", "work/ws", *flags, "--keep"],
        ["manifest", "work/ws"],
        ["unpack", "work/ws", *flags, "--keep"],
    ]
    assert sorted(p.name for p in (home / "work").iterdir()) == [".ws.tpulab-synced.json", "ws"]


def _manifest(python: str, home: Path, dest: str) -> subprocess.CompletedProcess[bytes]:
    argv = manifest_command(dest, python=python)
    return subprocess.run(argv, cwd=home, capture_output=True, timeout=60)


def test_the_vms_manifest_lists_its_regular_files_hashed_now(tmp_path: Path) -> None:
    python = python310()
    home = tmp_path / "home"
    home.mkdir()
    absent = _manifest(python, home, "ws")
    assert absent.returncode == 0, absent.stderr
    assert json.loads(absent.stdout) == {"manifest": []}
    assert not (home / "ws").exists()  # asking creates nothing
    write_tree(home / "ws", {"a.py": b"a", "sub/b.bin": b"\0" * 70_000})
    write_tree(tmp_path / "outside", {"secret": b"not the workspace's"})
    (home / "ws/to-outside").symlink_to(tmp_path / "outside/secret")
    (home / "ws/linked-dir").symlink_to(tmp_path / "outside")
    os.mkfifo(home / "ws/fifo")  # a FIFO the command left: listing must not block on it
    listed = _manifest(python, home, "ws")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["manifest"] == [
        {"path": "a.py", "bytes": 1, "sha256": hashlib.sha256(b"a").hexdigest()},
        {
            "path": "sub/b.bin",
            "bytes": 70_000,
            "sha256": hashlib.sha256(b"\0" * 70_000).hexdigest(),
        },
    ]
    (home / "file").write_text("x")
    refused = _manifest(python, home, "file")
    assert refused.returncode == 3
    assert "is not a directory" in refused.stderr.decode()
    refused = _manifest(python, home, "~")
    assert refused.returncode == 3
    assert "login directory" in refused.stderr.decode()


def _keep(*entries: dict[str, object]) -> tuple[tarfile.TarInfo, bytes]:
    return _member(".tpulab-keep.json"), json.dumps({"keep": list(entries)}).encode()


def _kept(path: str, data: bytes, **changes: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "path": path,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "mode": 0o644,
        "mtime": 1_700_000_000,
    }
    return entry | changes


def _as_synced(dest: Path) -> None:
    """Record every file in `dest` as a sync's (the record unpack keeps beside DEST), so
    what the next unpack drops is gone, as after a sync, not kept as a command's."""
    placed = {
        rel: [hashlib.sha256(data).hexdigest(), len(data)] for rel, data in snapshot(dest).items()
    }
    record = dest.parent / f".{dest.name}.tpulab-synced.json"
    record.write_text(json.dumps({"synced": placed}))


def test_a_hand_made_keep_list_is_honoured(tmp_path: Path) -> None:
    python = python310()
    home = tmp_path / "home"
    write_tree(home / "ws", {"kept.py": b"kept", "dropped.py": b"gone"})
    _as_synced(home / "ws")
    stream = _archive([_keep(_kept("kept.py", b"kept", mode=0o755)), (_member("new"), b"n")])
    result = _unpack(python, home, stream, "--keep")
    assert result.returncode == 0, result.stderr
    assert snapshot(home / "ws") == {"kept.py": b"kept", "new": b"n"}
    assert os.access(home / "ws/kept.py", os.X_OK)
    assert int((home / "ws/kept.py").stat().st_mtime) == 1_700_000_000
    assert [entry["path"] for entry in json.loads(result.stdout)["manifest"]] == ["kept.py", "new"]


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([(_member("new"), b"n")], "does not start with .tpulab-keep.json"),
        ([_keep(_kept("../previous.py", b"old"))], "would escape"),
        ([_keep(_kept("previous.py", b"older"))], "changed on the VM after its manifest"),
        ([_keep(_kept("previous.py", b"old", bytes=2))], "changed on the VM after"),
        ([_keep(_kept("absent.py", b"old"))], "no longer a regular file"),
        ([_keep(_kept("link.py", b"old"))], "behind a link"),
        ([_keep(_kept("dir/x.py", b"x"))], "behind a link"),
        ([_keep(_kept("previous.py", b"old")), (_member("previous.py"), b"x")], "twice"),
        ([_keep({"path": "previous.py"})], "malformed keep entry"),
        ([(_member(".tpulab-keep.json"), b"[1]")], 'no "keep" list'),
    ],
)
def test_unsafe_or_stale_keep_lists_are_refused_and_the_old_workspace_stays(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], why: str
) -> None:
    python = python310()
    home = tmp_path / "home"
    write_tree(home / "ws", {"previous.py": b"old"})
    write_tree(tmp_path / "outside", {"x.py": b"x"})
    (home / "ws/link.py").symlink_to(home / "ws/previous.py")
    (home / "ws/dir").symlink_to(tmp_path / "outside")
    before = snapshot(home / "ws")
    result = _unpack(python, home, _archive(members), "--keep")
    assert result.returncode == 3, result.stderr
    assert why in result.stderr.decode()
    assert result.stdout == b""
    assert snapshot(home / "ws") == before
    assert sorted(p.name for p in home.iterdir()) == ["ws"]


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_member("../evil.txt"), "would escape"),
        (_member("a/../../evil.txt"), "would escape"),
        (_member("/tmp/evil.txt"), "not a relative path"),
        (_member("link", tarfile.SYMTYPE, "/etc/passwd"), "not a regular file"),
        (_member("hard", tarfile.LNKTYPE, "../evil.txt"), "not a regular file"),
        (_member("fifo", tarfile.FIFOTYPE), "not a regular file"),
    ],
)
def test_unsafe_archives_are_refused_and_the_old_workspace_stays(
    tmp_path: Path, member: tarfile.TarInfo, why: str
) -> None:
    python = python310()
    home = tmp_path / "a" / "home"
    write_tree(home / "ws", {"previous.py": b"old"})
    result = _unpack(python, home, _archive([(_member("ok.txt"), b"ok"), (member, b"evil")]))
    assert result.returncode == 3, result.stderr
    assert why in result.stderr.decode()
    assert result.stdout == b""
    assert snapshot(home / "ws") == {"previous.py": b"old"}
    assert sorted(p.name for p in home.iterdir()) == ["ws"]
    assert not list((tmp_path / "a").glob("evil*"))
    assert not list(tmp_path.glob("evil*"))


def test_a_corrupt_or_truncated_stream_is_refused(tmp_path: Path) -> None:
    python = python310()
    home = tmp_path / "home"
    write_tree(home / "ws", {"previous.py": b"old"})
    _as_synced(home / "ws")
    good = _archive([(_member("a.txt"), b"A" * 5000)])
    flipped = bytearray(good)
    flipped[600] ^= 0x01  # a byte of a.txt's data: the tar still parses
    result = _unpack(python, home, bytes(flipped))
    assert result.returncode == 3
    assert "corrupt: sha256" in result.stderr.decode()
    result = _unpack(python, home, good[:-90])  # cut before the trailer
    assert result.returncode == 3
    assert snapshot(home / "ws") == {"previous.py": b"old"}
    assert _unpack(python, home, good).returncode == 0
    assert snapshot(home / "ws") == {"a.txt": b"A" * 5000}


def test_pack_refuses_over_the_cap_before_sending_anything(tmp_path: Path) -> None:
    python = python310()
    home = tmp_path / "home"
    write_tree(home / "ws", {"big.bin": b"\0" * 50_000, "mid.bin": b"\0" * 20_000, "s": b"x"})
    write_tree(home / "run", {"r.txt": b"r" * 100})
    (home / "log").write_text("log")
    out = tmp_path / "out"
    with pytest.raises(RemoteError) as refused:
        fetch_artifacts(
            LocalShell(home),
            workspace="ws",
            patterns=["*"],
            run_dir="run",
            log_path="log",
            out=out,
            max_bytes=60_000,
            timeout=60,
            python=python,
        )
    message = refused.value.message
    assert "68.5 KiB in 5 files, 9.9 KiB over the 58.6 KiB fetch cap;" in message  # by how much
    assert message.index("workspace/big.bin") < message.index("workspace/mid.bin")
    assert refused.value.hint
    assert "--max-fetch" in refused.value.hint
    assert not [p for p in out.iterdir()] if out.exists() else True


def test_pack_never_leaves_the_workspace_through_a_symlink_and_names_the_link(
    tmp_path: Path,
) -> None:
    python = python310()
    home = tmp_path / "home"
    write_tree(home / "ws", {"inside.txt": b"in", "sub/kept.txt": b"k"})
    write_tree(tmp_path / "outside", {"secret.txt": b"laptop-only"})
    outside = os.path.realpath(tmp_path / "outside")
    os.symlink(tmp_path / "outside", home / "ws" / "escape")  # a directory, at the top
    os.symlink(tmp_path / "outside" / "secret.txt", home / "ws" / "sub" / "peek.txt")
    os.symlink(home / "ws" / "inside.txt", home / "ws" / "sub" / "near.txt")  # stays in
    write_tree(home / "run", {"metrics.jsonl": b"{}"})
    os.symlink(tmp_path / "outside", home / "run" / "data")  # out of the run directory
    out = tmp_path / "out"
    got = fetch_artifacts(
        LocalShell(home),
        workspace="ws",
        patterns=["**", "escape/*", "sub"],
        run_dir="run",
        log_path="nolog",
        out=out,
        timeout=60,
        python=python,
    )
    assert [entry.path for entry in got.entries] == [
        "run/metrics.jsonl",
        "workspace/inside.txt",
        "workspace/sub/kept.txt",
        "workspace/sub/near.txt",
    ]
    assert "escape/*" in got.missing
    assert str(home / "nolog") in got.missing
    # Each link that leads out is named once, however many patterns and files met it.
    assert got.skipped == (
        f"run/data -> {outside}",
        f"workspace/escape -> {outside}",
        f"workspace/sub/peek.txt -> {outside}/secret.txt",
    )
    assert json.loads((out / "manifest.json").read_text())["skipped"] == list(got.skipped)
    assert got.describe_skipped() == (
        "; skipped 3 links leading out of the workspace: " + ", ".join(got.skipped)
    )
    assert not list(out.rglob("secret.txt"))


class HostileShell:
    """A 'VM' that answers a fetch with an archive of its own making."""

    def __init__(self, archive: bytes) -> None:
        self.archive = archive

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> Result:
        assert argv[2] == transfer_source()
        assert argv[3] == "pack"
        assert stdout is not None
        stdout.write(self.archive)
        return Result(0, "", "")


def _packed(members: list[tuple[tarfile.TarInfo, bytes]], manifest: object) -> bytes:
    body = json.dumps(manifest).encode()
    raw = _archive([*members, (_member(".tpulab-manifest.json"), body)])
    return raw[: -len("TPULAB-ARCHIVE-SHA256:") - 64]  # pack sends no trailer


@pytest.mark.parametrize("name", ["../escape.txt", "/tmp/escape.txt", "a/../../escape.txt"])
def test_fetch_refuses_an_archive_with_unsafe_paths(tmp_path: Path, name: str) -> None:
    data = b"evil"
    manifest = {
        "manifest": [{"path": name, "bytes": 4, "sha256": hashlib.sha256(data).hexdigest()}],
        "missing": [],
        "skipped": [],
    }
    out = tmp_path / "deep" / "out"
    with pytest.raises(RemoteError, match="unsafe path"):
        fetch_artifacts(
            HostileShell(_packed([(_member(name), data)], manifest)),
            workspace="ws",
            patterns=[],
            run_dir="run",
            log_path="log",
            out=out,
            timeout=60,
        )
    assert not out.exists()  # nothing kept, not even an empty --out
    assert not list(tmp_path.rglob(".tpulab-fetch-*"))  # nor the staging beside it
    assert not list(tmp_path.rglob("escape.txt"))


def test_fetch_refuses_files_that_differ_from_the_vms_manifest(tmp_path: Path) -> None:
    manifest = {
        "manifest": [{"path": "run/a", "bytes": 4, "sha256": hashlib.sha256(b"good").hexdigest()}],
        "missing": [],
        "skipped": [],
    }
    out = tmp_path / "out"
    with pytest.raises(RemoteError, match="differ from the VM's manifest: run/a"):
        fetch_artifacts(
            HostileShell(_packed([(_member("run/a"), b"evil")], manifest)),
            workspace="ws",
            patterns=[],
            run_dir="run",
            log_path="log",
            out=out,
            timeout=60,
        )
    assert not out.exists()  # nothing kept, no manifest.json, no empty --out
    assert not list(tmp_path.rglob(".tpulab-fetch-*"))


@pytest.mark.parametrize("dest", ["~", ".", "..", "/"])
def test_unpack_never_replaces_the_login_directory_or_above(tmp_path: Path, dest: str) -> None:
    python = python310()
    home = tmp_path / "home"
    write_tree(home, {".ssh/authorized_keys": b"ssh-ed25519 AAAA"})
    argv = unpack_command(dest, python=python)
    result = subprocess.run(
        argv,
        cwd=home,
        input=_archive([(_member("a.txt"), b"a")]),
        capture_output=True,
        timeout=60,
        env={**os.environ, "HOME": str(home)},
    )
    assert result.returncode == 3
    assert b"login directory" in result.stderr
    assert snapshot(home) == {".ssh/authorized_keys": b"ssh-ed25519 AAAA"}
    with pytest.raises(WorkspaceError, match="login directory"):
        upload_workspace(LocalShell(home), select_workspace(home), dest, timeout=60)


def test_fetch_dot_brings_the_whole_workspace_and_pack_refuses_escaping_patterns(
    tmp_path: Path,
) -> None:
    python = python310()
    home = tmp_path / "home"
    write_tree(home / "ws", {"a.txt": b"a", "sub/b.txt": b"b"})
    (home / "run").mkdir()
    got = fetch_artifacts(
        LocalShell(home),
        workspace="ws",
        patterns=["."],
        run_dir="run",
        log_path="log",
        out=tmp_path / "out",
        timeout=60,
        python=python,
    )
    assert [entry.path for entry in got.entries] == ["workspace/a.txt", "workspace/sub/b.txt"]
    argv = [python, "-c", transfer_source(), "pack", "--workspace", "ws", "--run-dir", "run"]
    argv += ["--log", "log", "--max-bytes", "100", "--", "../"]
    result = subprocess.run(argv, cwd=home, capture_output=True, timeout=60)
    assert result.returncode == 3
    assert b"not inside the workspace" in result.stderr
    assert result.stdout == b""


def test_pack_never_reads_the_log_through_a_link(tmp_path: Path) -> None:
    # The user's command replaced its log with a link (to /etc/passwd, here a stand-in
    # outside the run dir): it is not followed, as nothing under the run dir is.
    python = python310()
    home = tmp_path / "home"
    write_tree(home / "run", {"r.txt": b"r"})
    write_tree(tmp_path / "outside", {"passwd": b"root:x:0:0"})
    (home / "output.log").symlink_to(tmp_path / "outside" / "passwd")
    out = tmp_path / "out"
    got = fetch_artifacts(
        LocalShell(home),
        workspace="ws",
        patterns=[],
        run_dir="run",
        log_path="output.log",
        out=out,
        timeout=60,
        python=python,
    )
    assert [entry.path for entry in got.entries] == ["run/r.txt"]
    assert str(home / "output.log") in got.missing
    assert not (out / "output.log").exists()


LAUNCHER = Path(__file__).resolve().parent.parent / "remote_payloads" / "workload_launcher.py"
# The command of the test below: it writes results where no pattern asks for them,
# rewrites an uploaded file, and leaves what nobody wants named (bytecode, a venv).
WRITES = """
import os, pathlib
for rel, text in [("out/metrics.json", "{}"), ("out/ckpt/step_1.npz", "x" * 1000),
                  ("wanted.txt", "w"), ("train.py", "print('changed')\\n"),
                  ("pkg/__pycache__/m.cpython-310.pyc", "b"), ("loose.pyc", "b"),
                  (".venv/lib/site.py", "v"), ("myenv/pyvenv.cfg", "home = /usr"),
                  ("myenv/lib/x.py", "v")]:
    path = pathlib.Path(rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
os.symlink("out/metrics.json", "latest")  # not a regular file: not counted
"""


def test_pack_names_what_the_command_wrote_and_no_pattern_fetched(tmp_path: Path) -> None:
    """A run's VM is deleted after the fetch: files the command wrote into the workspace
    that no --fetch pattern matched go with it, so the fetch counts and names them. Told
    apart from the upload's files by ctime, against the launcher's stamp: the upload sets
    each file's mtime to the laptop's (here a day ahead, a laptop whose clock runs
    fast), which an mtime test would take for the command's."""
    python = python310()
    laptop = write_tree(tmp_path / "laptop", {"train.py": "print('hi')\n", "data/old.bin": "o"})
    ahead = time.time() + 86_400
    for path in ("train.py", "data/old.bin"):
        os.utime(laptop / path, (ahead, ahead))
    home = tmp_path / "home"
    home.mkdir()
    shell = LocalShell(home)
    upload_workspace(shell, select_workspace(laptop), "ws", timeout=60, python=python)
    run = home / "run"
    launched = subprocess.run(
        [
            python, str(LAUNCHER), "--workspace", str(home / "ws"), "--run-dir", str(run / "out"),
            "--log", str(run / "output.log"), "--pid-file", str(run / "pid"),
            "--status", str(run / "status.json"), "--venv", str(home / "venv"),
            "--timeout", "60", "--", python, "-c", WRITES,
        ],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    got = fetch_artifacts(
        shell,
        workspace="ws",
        patterns=["wanted.txt"],
        run_dir="run/out",
        log_path="run/output.log",
        status_path="run/status.json",
        out=tmp_path / "out",
        timeout=60,
        python=python,
    )
    assert [e.path for e in got.entries] == ["output.log", "workspace/wanted.txt"]
    # Not the upload's untouched data/old.bin, the fetched wanted.txt, bytecode, the
    # venvs (by name, and by their pyvenv.cfg) or the link; the rewritten train.py is.
    assert got.left == LeftBehind(
        files=3,
        bytes=2 + 1000 + len("print('changed')\n"),
        first=("train.py", "out/metrics.json", "out/ckpt/step_1.npz"),
    )
    assert got.left.patterns() == ["'train.py'", "'out/**'"]
    assert got.describe_left() == (
        "; 3 files (1019 B) your command wrote in the workspace were not fetched: "
        "train.py, out/metrics.json, out/ckpt/step_1.npz; "
        "--fetch 'train.py' --fetch 'out/**' brings them"
    )
    recorded = json.loads((tmp_path / "out" / "manifest.json").read_text())["left"]
    assert recorded == got.left.to_json_obj()


def test_pack_says_nothing_of_what_was_left_when_the_command_never_started(
    tmp_path: Path,
) -> None:
    python = python310()
    home = tmp_path / "home"
    write_tree(home / "ws", {"new.txt": b"n"})
    got = fetch_artifacts(
        LocalShell(home),
        workspace="ws",
        patterns=[],
        run_dir="run",
        log_path="log",
        status_path="run/status.json",  # no status: no launcher ran
        out=tmp_path / "out",
        timeout=60,
        python=python,
    )
    assert got.left is None
    assert got.describe_left() == ""


class _CutAt:
    """The laptop's end of a stream that breaks after `limit` bytes (a signal, a drop)."""

    def __init__(self, sink: BinaryIO, limit: int) -> None:
        self.sink, self.limit, self.size = sink, limit, 0

    def write(self, data: bytes) -> int:
        if self.size + len(data) > self.limit:
            data = data[: self.limit - self.size]
            self.sink.write(data)
            raise KeyboardInterrupt  # what a second Ctrl-C is, with no signal guard
        self.size += len(data)
        return self.sink.write(data)


class CuttingShell(LocalShell):
    def __init__(self, home: Path, limit: int) -> None:
        super().__init__(home)
        self.limit = limit

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> Result:
        assert stdout is not None
        cut = cast(BinaryIO, _CutAt(stdout, self.limit))  # write() is all it uses
        return super().run_streaming(argv, stdin=stdin, stdout=cut, timeout=timeout, env=env)


def test_a_fetch_cut_short_keeps_each_file_that_fully_arrived_and_checked(
    tmp_path: Path,
) -> None:
    python = python310()
    home = tmp_path / "home"
    files = {"a.bin": os.urandom(300_000), "b.bin": os.urandom(300_000), "c.bin": os.urandom(2**20)}
    write_tree(home / "run", files)
    (home / "output.log").write_text("the log\n")
    out = tmp_path / "out"
    kept: list[object] = []
    # output.log, a.bin, b.bin arrive whole; the cut falls inside c.bin.
    with pytest.raises(KeyboardInterrupt):
        fetch_artifacts(
            CuttingShell(home, 700_000),
            workspace="ws",
            patterns=[],
            run_dir="run",
            log_path="output.log",
            out=out,
            timeout=60,
            python=python,
            kept=kept.append,
        )
    assert (out / "run" / "a.bin").read_bytes() == files["a.bin"]
    assert (out / "run" / "b.bin").read_bytes() == files["b.bin"]
    assert (out / "output.log").read_text() == "the log\n"
    assert not (out / "run" / "c.bin").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert [entry["path"] for entry in manifest["files"]] == [
        "output.log",
        "run/a.bin",
        "run/b.bin",
    ]
    assert len(kept) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "out"]  # no staging left
