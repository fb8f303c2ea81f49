"""The workspace goes up and the artifacts come back, each as ONE streamed tar archive.

Pure Python, no paramiko: the archive is written to (and read from) a `StreamShell`,
which `tpulab.remote.ssh.Connection` implements over one SSH channel. The remote half is
`remote_payloads/transfer.py` (stdlib only, Python 3.10), run as `python3 -c <source>`
so that nothing has to be staged first. Which files go up is decided before anything is
created, by `tpulab.remote.selection` (re-exported here, so callers import one module).

Upload, `upload_workspace` (the same mechanism for a fresh VM and a kept one):
    VM:     `transfer.py manifest`: the content manifest (path, bytes, sha256) of the
            files the last sync placed in `remote_dir` (its record beside it), hashed
            from the files as they are now (the user's command may have changed them);
            none for an absent directory.
    laptop: diffs the selection against it (a file is hashed here only when its path and
            size match), then a tar stream of ONLY the new or changed files, built file
            by file (each hashed as it is archived, read once), led by a keep list (path,
            bytes, sha256, mode, mtime) of the unchanged ones when there are any
            -> trailer: the archive's sha256
    VM:     `transfer.py unpack [--keep]`: copies the kept files from the old directory
            into a staging directory next to `remote_dir`, re-hashing each (one that no
            longer matches is refused: stale bytes are never kept), extracts the archive
            there (no absolute names, no `..`, no links, no devices), checks the trailer,
            hard-links in what earlier commands wrote (nothing a sync placed), swaps the
            staging directory in for `remote_dir` (what a sync placed and is no longer
            selected goes with the old one), records what this sync placed and prints
            its manifest; the laptop's full manifest must equal it.

Fetch, `fetch_artifacts`:
    VM:     `transfer.py pack`: globs the patterns inside the workspace, adds the run
            directory and the log, refuses over the cap BEFORE sending (listing the
            largest entries), streams the tar; its last member is the manifest
            (path, bytes, sha256), hashed as each file was read.
    laptop: spools the stream into `out` (counted against the cap), extracts it safely
            into a staging directory, checks every file against the manifest, moves
            them into place and writes `out/manifest.json`. Layout of `out`:
            `run/...` (the run directory), `workspace/<path>` (the `--fetch` matches),
            `<basename of the log>`.
            A fetch cut short (a second Ctrl-C, its time bound, a dropped connection)
            keeps what had arrived: each member's header carries the sha256 of the file
            before it, so every file that fully arrived and was vouched for goes into
            `out` (`manifest.json` lists them, `"complete": false`); the file the cut
            fell in, or whose sha256 had not arrived yet, is not kept.

Uncompressed tar is the default: on the links these run over (loopback, a VM's NIC)
gzip costs more CPU time than it saves wire time; `gzip=True` is there to measure that
(tests/benchmarks/bench_transfer.py) and for slow links.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, cast

from tpulab import paths
from tpulab.errors import ArtifactWriteError, RemoteError, WorkspaceError
from tpulab.remote.bootstrap import CommandResult
from tpulab.remote.manifest import LeftBehind, Manifest, ManifestEntry
from tpulab.remote.selection import (
    ALWAYS_EXCLUDED,
    DEFAULT_MAX_UPLOAD,
    IGNORE_FILE,
    UploadSelection,
    check_fetch_patterns,
    first_few,
    human_size,
    select_workspace,
)

__all__ = [
    "ALWAYS_EXCLUDED",
    "DEFAULT_MAX_FETCH",
    "DEFAULT_MAX_UPLOAD",
    "IGNORE_FILE",
    "MANIFEST_FILE",
    "LeftBehind",
    "Manifest",
    "ManifestEntry",
    "StreamShell",
    "UploadResult",
    "UploadSelection",
    "WorkspaceError",
    "check_fetch_patterns",
    "fetch_artifacts",
    "fetch_command",
    "manifest_command",
    "planned_answer",
    "remote_manifest",
    "select_workspace",
    "transfer_source",
    "unpack_command",
    "upload_workspace",
]

DEFAULT_MAX_FETCH = 2**30
MANIFEST_FILE = "manifest.json"  # in `out`, next to the fetched files


# The transfer script's wire conventions (remote_payloads/transfer.py says the same).
_TRAILER_PREFIX = b"TPULAB-ARCHIVE-SHA256:"
_MANIFEST_MEMBER = ".tpulab-manifest.json"
_PREV_SHA256 = "TPULAB.prev.sha256"  # PAX key: the sha256 of the member before
_KEEP_MEMBER = ".tpulab-keep.json"  # first member with `unpack --keep`
_REFUSED = 3
_CHUNK = 1 << 20
_BLOCK = tarfile.BLOCKSIZE
# The archive may exceed the sum of its files by headers and padding; past this much
# more the VM is not sending what `pack` would, and the download stops.
_FETCH_OVERHEAD = 64 * 2**20


class StreamShell(Protocol):
    """What the transfers need from `tpulab.remote.ssh.Connection`: one command whose
    stdin is fed from `stdin` and whose stdout goes to `stdout`, chunk by chunk (never
    the whole stream in memory); stderr is captured into the result."""

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult: ...


# -- manifests ------------------------------------------------------------------------


@dataclass(frozen=True)
class UploadResult:
    """What an upload did: the workspace now on the VM and what it took to get it there."""

    manifest: Manifest  # the whole workspace now on the VM (== the laptop's selection)
    sent: Manifest  # what went over the wire (new or changed files)
    unchanged: int  # files kept from the VM's previous copy
    removed: int  # files an earlier sync placed that are no longer in the selection
    wire_bytes: int  # bytes of the archive actually streamed (headers and trailer too)
    # What earlier commands wrote in the workspace (no sync placed it), kept there: a
    # session's checkpoints and results survive its next exec's sync.
    carried: int = 0
    carried_bytes: int = 0
    # Synced files that changed on the VM since their sync (a command, an editor,
    # Jupyter) which this sync replaced or removed: their VM copies were set aside in
    # `replaced_dir` on the VM, never lost. The first few paths.
    replaced: tuple[str, ...] = ()
    replaced_count: int = 0
    replaced_dir: str | None = None

    def describe(self) -> str:
        """E.g. "2 of 120 files sent (12.0 KiB); 118 unchanged; 1 removed; 3 written by
        earlier commands kept (1.5 GiB)"."""
        text = (
            f"{self.sent.count} of {self.manifest.count} files sent "
            f"({human_size(self.sent.total_bytes)}); {self.unchanged} unchanged"
        )
        text += f"; {self.removed} removed" if self.removed else ""
        if self.carried:
            text += (
                f"; {self.carried} written by earlier commands kept "
                f"({human_size(self.carried_bytes)})"
            )
        return text

    def describe_replaced(self) -> str:
        """ "1 file changed on the VM since the last sync was replaced by the laptop's;
        the VM's copy is in DIR on the VM: lab.ipynb", or "" (said apart from `describe`,
        as a warning: an edit made on the VM is where the user does not look for it)."""
        if not self.replaced_count:
            return ""
        noun = "file" if self.replaced_count == 1 else "files"
        verb = "was" if self.replaced_count == 1 else "were"
        copies = "copy is" if self.replaced_count == 1 else "copies are"
        return (
            f"{self.replaced_count} {noun} changed on the VM since the last sync {verb} "
            f"replaced by the laptop's; the VM's {copies} in {self.replaced_dir} on the VM: "
            f"{first_few(self.replaced)}"
        )


# -- the remote script ----------------------------------------------------------------


@functools.cache
def transfer_source() -> str:
    """The source of remote_payloads/transfer.py, which travels as `python3 -c`."""
    return paths.payload_path("transfer.py").read_text(encoding="utf-8")


def manifest_command(remote_dir: str, *, python: str = "python3") -> list[str]:
    return [python, "-c", transfer_source(), "manifest", remote_dir]


def unpack_command(
    remote_dir: str, *, python: str = "python3", gzip: bool = False, keep: bool = False
) -> list[str]:
    flags = [*(["--gzip"] if gzip else []), *(["--keep"] if keep else [])]
    return [python, "-c", transfer_source(), "unpack", remote_dir, *flags]


def fetch_command(
    *,
    workspace: str,
    patterns: Sequence[str],
    run_dir: str,
    log_path: str,
    max_bytes: int,
    status_path: str | None = None,
    python: str = "python3",
    gzip: bool = False,
) -> list[str]:
    """The packer's argv; with `status_path` (the launcher's status file) it also counts
    what the command wrote in the workspace and nobody asked for (the manifest's `left`),
    not walking what the upload always excludes."""
    left = (
        []
        if status_path is None
        else ["--status", status_path, "--exclude", json.dumps(list(ALWAYS_EXCLUDED))]
    )
    return [
        python,
        "-c",
        transfer_source(),
        "pack",
        "--workspace",
        workspace,
        "--run-dir",
        run_dir,
        "--log",
        log_path,
        "--max-bytes",
        str(max_bytes),
        *left,
        *(["--gzip"] if gzip else []),
        "--",
        *check_fetch_patterns(patterns),
    ]


def planned_answer(argv: Sequence[str]) -> bytes | None:
    """What a VM that received nothing writes on stdout for a transfer command, for the
    recording session of a dry run (None: not a transfer): `manifest` and `unpack` an
    empty manifest (the VM holds nothing yet, so everything goes up; the plan streams no
    workspace, so there is nothing to check), `pack` an archive holding only an empty
    manifest."""
    if list(argv[1:3]) != ["-c", transfer_source()] or len(argv) < 4:
        return None
    if argv[3] in ("manifest", "unpack"):
        return b'{"manifest": []}\n'
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|gz" if "--gzip" in argv else "w|") as tar:
        body = json.dumps({"manifest": [], "missing": [], "skipped": [], "left": None}).encode()
        info = tarfile.TarInfo(_MANIFEST_MEMBER)
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def _existing_ancestor(path: Path) -> Path:
    """The nearest directory of `path` (itself included) that exists already."""
    here = path.absolute()
    while not here.is_dir() and here != here.parent:
        here = here.parent
    return here


def _refusal(result: CommandResult) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    said = lines[-1] if lines else f"exit status {result.exit_status}, nothing on stderr"
    return said.removeprefix("transfer: ")


# -- upload ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Kept:
    """A selected file the VM holds already (same path, bytes and sha256): not sent. The
    mode and mtime are the laptop's, as a full upload would set them on the VM's copy."""

    entry: ManifestEntry
    mode: int
    mtime: int

    def to_json_obj(self) -> dict[str, Any]:
        entry = self.entry
        return {
            "path": entry.path,
            "bytes": entry.bytes,
            "sha256": entry.sha256,
            "mode": self.mode,
            "mtime": self.mtime,
        }


@dataclass(frozen=True)
class _Delta:
    """What goes up and what the VM keeps (what it removes, the VM says: only it knows
    which of its files a sync placed)."""

    send: tuple[tuple[str, int], ...]  # (path, size), in selection order
    keep: tuple[_Kept, ...]


def _open_selected(path: Path, size: int) -> tuple[BinaryIO, os.stat_result]:
    """A selected file opened for reading; WorkspaceError if it changed size since the
    selection (the selection is what was checked and what the manifest must say)."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise WorkspaceError(f"Cannot read {path}: {exc.strerror}") from exc
    now = os.fstat(handle.fileno())
    if now.st_size != size:
        handle.close()
        raise WorkspaceError(
            f"{path} changed while the workspace was uploading ({size} -> {now.st_size} bytes)",
            hint="Run again once whatever writes it has finished.",
        )
    return handle, now


def _mode_of(status: os.stat_result) -> int:
    return 0o755 if status.st_mode & stat.S_IXUSR else 0o644


def _delta(selection: UploadSelection, on_vm: Manifest) -> _Delta:
    """Diff the selection against the VM's manifest. Only a file whose path and size
    match one on the VM is hashed here (the others must go up anyway, and are hashed as
    they are archived), so a first upload reads each file once, as before."""
    there = {entry.path: entry for entry in on_vm.entries}
    send: list[tuple[str, int]] = []
    keep: list[_Kept] = []
    for rel, size in selection.files:
        old = there.get(rel)
        if old is None or old.bytes != size:
            send.append((rel, size))
            continue
        path = selection.root / rel
        handle, status = _open_selected(path, size)
        digest = hashlib.sha256()
        with handle:
            try:
                for chunk in iter(functools.partial(handle.read, _CHUNK), b""):
                    digest.update(chunk)
            except OSError as exc:
                raise WorkspaceError(f"Cannot read {path}: {exc.strerror}") from exc
        if digest.hexdigest() == old.sha256:
            keep.append(_Kept(old, _mode_of(status), int(status.st_mtime)))
        else:
            send.append((rel, size))
    return _Delta(tuple(send), tuple(keep))


class _ArchiveWriter:
    """The upload's tar stream as chunks, built one file at a time (never whole): the
    keep list first (when the VM keeps anything), then the files that go up."""

    def __init__(self, root: Path, delta: _Delta, gzip: bool) -> None:
        self.root = root
        self.delta = delta
        self.digest = hashlib.sha256()
        self.entries: list[ManifestEntry] = []  # what was sent, hashed as read
        self.wire_bytes = 0
        self._compressor = zlib.compressobj(6, zlib.DEFLATED, 31) if gzip else None

    def _emit(self, data: bytes) -> bytes:
        if self._compressor is not None:
            data = self._compressor.compress(data)
        self.digest.update(data)
        return data

    def _member(self, info: tarfile.TarInfo) -> bytes:
        return self._emit(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))

    def _padding(self, size: int) -> Iterator[bytes]:
        if size % _BLOCK:
            yield self._emit(bytes(_BLOCK - size % _BLOCK))

    def _keep_list(self) -> Iterator[bytes]:
        keep = [kept.to_json_obj() for kept in self.delta.keep]
        body = json.dumps({"keep": keep}, separators=(",", ":")).encode()
        info = tarfile.TarInfo(_KEEP_MEMBER)
        info.size = len(body)
        info.mode = 0o644
        yield self._member(info)
        yield self._emit(body)
        yield from self._padding(len(body))

    def _file(self, rel: str, size: int) -> Iterator[bytes]:
        path = self.root / rel
        handle, now = _open_selected(path, size)
        with handle:
            info = tarfile.TarInfo(rel)
            info.size = size
            info.mtime = int(now.st_mtime)
            info.mode = _mode_of(now)
            yield self._member(info)
            digest, left = hashlib.sha256(), size
            while left:
                try:
                    chunk = handle.read(min(_CHUNK, left))
                except OSError as exc:  # a local failure, not the connection's
                    raise WorkspaceError(f"Cannot read {path}: {exc.strerror}") from exc
                if not chunk:
                    raise WorkspaceError(f"{path} shrank while the workspace was uploading")
                left -= len(chunk)
                digest.update(chunk)
                yield self._emit(chunk)
            yield from self._padding(size)
        self.entries.append(ManifestEntry(rel, size, digest.hexdigest()))

    def _pieces(self) -> Iterator[bytes]:
        if self.delta.keep:
            yield from self._keep_list()
        for rel, size in self.delta.send:
            yield from self._file(rel, size)

    def chunks(self) -> Iterator[bytes]:
        # Headers and padding are small pieces: send them coalesced with file data, in
        # pieces of about _CHUNK, not one SSH packet each (2 000 files: ~3x faster).
        pending = bytearray()
        for piece in self._pieces():
            pending += piece
            if len(pending) >= _CHUNK:
                self.wire_bytes += len(pending)
                yield bytes(pending)
                pending.clear()
        pending += self._emit(bytes(2 * _BLOCK))
        if self._compressor is not None:
            flushed = self._compressor.flush()
            self.digest.update(flushed)
            pending += flushed
        yield bytes(pending)
        trailer = _TRAILER_PREFIX + self.digest.hexdigest().encode("ascii")
        self.wire_bytes += len(pending) + len(trailer)
        yield trailer


def _checked_remote_dir(remote_dir: str) -> None:
    where = remote_dir.strip()
    if not where or posixpath.normpath(where) in (".", "/", "~") or ".." in where.split("/"):
        raise WorkspaceError(
            f"Remote workspace directory {remote_dir!r} would replace the login directory "
            "(or more); name a directory of its own, e.g. ~/tpulab-workspace"
        )


def remote_manifest(
    shell: StreamShell, remote_dir: str, *, timeout: float, python: str = "python3"
) -> Manifest:
    """What `remote_dir` on the VM holds now (path, bytes, sha256), hashed there from
    the files themselves; empty when it does not exist."""
    _checked_remote_dir(remote_dir)
    answer = io.BytesIO()
    result = shell.run_streaming(
        manifest_command(remote_dir, python=python), stdin=None, stdout=answer, timeout=timeout
    )
    if result.exit_status != 0:
        raise RemoteError(
            f"The VM could not list its copy of the workspace in {remote_dir}: {_refusal(result)}",
            hint="Nothing was sent or replaced. Retry; if it persists, check the VM's "
            "python3 and that the directory is readable.",
        )
    try:
        return Manifest.from_json_obj(json.loads(answer.getvalue())["manifest"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RemoteError(f"The VM's listing of {remote_dir} is not a manifest: {exc}") from exc


def upload_workspace(
    shell: StreamShell,
    selection: UploadSelection,
    remote_dir: str,
    *,
    timeout: float,
    python: str = "python3",
    gzip: bool = False,
) -> UploadResult:
    """Make `remote_dir` on the VM hold the selected files, sending only those it does
    not hold already (by path, bytes and sha256 against its manifest, computed there
    first); the rest it keeps from its previous copy, re-checked. What an earlier sync
    placed and is no longer selected goes with that copy; what earlier commands wrote
    there (no sync placed it) stays, unless a selected file takes its path.

    RemoteError if the VM refused the archive (corrupt, cut short, unsafe, a kept file
    that changed on the VM in between) or holds anything other than the selection
    afterwards; `remote_dir` keeps its old content then."""
    _checked_remote_dir(remote_dir)
    on_vm = remote_manifest(shell, remote_dir, timeout=timeout, python=python)
    delta = _delta(selection, on_vm)
    writer = _ArchiveWriter(selection.root, delta, gzip)
    answer = io.BytesIO()
    result = shell.run_streaming(
        unpack_command(remote_dir, python=python, gzip=gzip, keep=bool(delta.keep)),
        stdin=writer.chunks(),
        stdout=answer,
        timeout=timeout,
    )
    if result.exit_status != 0:
        raise RemoteError(
            f"The VM refused the workspace upload to {remote_dir}: {_refusal(result)}",
            hint="Nothing was replaced on the VM. Retry; if it persists, check the VM's "
            "disk space and its python3.",
        )
    try:
        said = json.loads(answer.getvalue())
        remote = Manifest.from_json_obj(said["manifest"])
        removed = int(said.get("removed", 0))  # a dry run's answer has none of these
        carried = said.get("carried") or {"files": 0, "bytes": 0}
        carried_files, carried_bytes = int(carried["files"]), int(carried["bytes"])
        replaced = said.get("replaced") or {"files": 0, "dir": None, "first": []}
        replaced_count, replaced_dir = int(replaced["files"]), replaced["dir"]
        replaced_first = tuple(str(path) for path in replaced["first"])
        if replaced_count and not isinstance(replaced_dir, str):
            raise ValueError(f"files were set aside but no directory is named: {replaced!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RemoteError(f"The VM's answer to the upload is not a manifest: {exc}") from exc
    sent = Manifest.from_json_obj(Manifest(tuple(writer.entries)).to_json_obj())
    kept = tuple(kept.entry for kept in delta.keep)
    local = Manifest.from_json_obj(Manifest(sent.entries + kept).to_json_obj())
    if remote != local:
        raise RemoteError(
            f"The workspace on the VM ({remote_dir}) differs from what was sent: "
            + _differences(local, remote),
            hint="Retry the run; if it persists the VM's disk may be failing.",
        )
    return UploadResult(
        manifest=local,
        sent=sent,
        unchanged=len(kept),
        removed=removed,
        wire_bytes=writer.wire_bytes,
        carried=carried_files,
        carried_bytes=carried_bytes,
        replaced=replaced_first,
        replaced_count=replaced_count,
        replaced_dir=replaced_dir if replaced_count else None,
    )


def _differences(expected: Manifest, observed: Manifest) -> str:
    want = {entry.path: entry for entry in expected.entries}
    got = {entry.path: entry for entry in observed.entries}
    problems = [f"{path} missing" for path in sorted(want.keys() - got.keys())]
    problems += [f"{path} unexpected" for path in sorted(got.keys() - want.keys())]
    problems += [
        f"{path} (sha256 {got[path].sha256[:12]}..., {got[path].bytes} bytes; expected "
        f"{want[path].sha256[:12]}..., {want[path].bytes} bytes)"
        for path in sorted(want.keys() & got.keys())
        if want[path] != got[path]
    ]
    shown = "; ".join(problems[:10])
    return shown + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")


# -- fetch ----------------------------------------------------------------------------


class _CappedSpool:
    """The fetched stream on disk; refuses to grow past `limit` bytes. A write this disk
    refuses is ArtifactWriteError: raised inside the SSH stream, a bare OSError would be
    taken there for the connection's (ssh.Connection._mapped lets tpulab's own pass)."""

    def __init__(self, handle: BinaryIO, limit: int, out: Path) -> None:
        self.handle = handle
        self.limit = limit
        self.out = out
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise RemoteError(
                f"The VM sent more than {self.limit} bytes of artifacts, past the fetch cap",
                hint="The VM's packer did not honour --max-fetch; nothing was kept.",
            )
        try:
            return self.handle.write(data)
        except OSError as error:
            raise _unwritable(self.out, error) from None


def _unwritable(out: Path, error: OSError) -> ArtifactWriteError:
    """This machine could not write what arrived (staged beside `out`, then moved in)."""
    return ArtifactWriteError(
        f"The artifacts could not be written into {out} on this machine: "
        f"{error.strerror or error}.",
        hint="Free space on that disk, or pass --out on another one. A session's VM (tpulab "
        "up) keeps them until the next exec replaces its workspace (`tpulab ssh` reaches "
        "them); a run's VM was deleted with them.",
    )


def _ensure_dir(directory: Path, made: set[Path]) -> None:
    # Once per directory, not per file: a failing mkdir per file is most of the cost of
    # extracting thousands of small files.
    if directory not in made:
        directory.mkdir(parents=True, exist_ok=True)
        made.add(directory)


def _safe_member(name: str) -> str:
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts or "\\" in name or "\0" in name:
        raise RemoteError(f"The fetched archive holds an unsafe path {name!r}; nothing was kept")
    return "/".join(parts)


@dataclass
class _Unpacked:
    """What an extraction got to (filled in as it goes, so a cut stream keeps it)."""

    written: list[ManifestEntry]
    vouched: dict[str, str]  # path -> the sha256 the VM sent for it
    claimed: Manifest | None = None


def _unpack_local(spool: BinaryIO, staging: Path, gzip: bool, done: _Unpacked) -> None:
    """Extract the archive in `spool` into `staging`, recording into `done` each file
    written and every sha256 the VM vouched for (the next member's header, the manifest)."""
    seen: set[str] = set()
    made: set[Path] = set()
    previous: str | None = None
    with tarfile.open(fileobj=spool, mode="r|gz" if gzip else "r|") as tar:
        for member in tar:
            name = _safe_member(member.name)
            vouched = member.pax_headers.get(_PREV_SHA256)
            if previous is not None and vouched is not None:
                done.vouched[previous] = vouched
            if not member.isreg() or name in seen:
                raise RemoteError(
                    f"The fetched archive holds {name!r} as a link, device or duplicate; "
                    "nothing was kept"
                )
            seen.add(name)
            source = tar.extractfile(member)
            assert source is not None  # a regular member always has data
            if name == _MANIFEST_MEMBER:
                body = json.loads(source.read(64 * 2**20))
                done.claimed = Manifest.from_json_obj(
                    body["manifest"],
                    missing=body["missing"],
                    skipped=body["skipped"],
                    left=body.get("left"),  # absent: the packer said nothing of it
                )
                done.vouched.update((e.path, e.sha256) for e in done.claimed.entries)
                continue
            target = staging / name
            _ensure_dir(target.parent, made)
            digest, size = hashlib.sha256(), 0
            with target.open("xb") as out:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
            done.written.append(ManifestEntry(name, size, digest.hexdigest()))
            previous = name


def _place(files: Path, out: Path, manifest: Manifest, *, complete: bool) -> None:
    """Move the checked files from staging into `out` and write `out/manifest.json`."""
    out.mkdir(parents=True, exist_ok=True)
    made: set[Path] = set()
    for entry in manifest.entries:
        target = out / entry.path
        _ensure_dir(target.parent, made)
        os.replace(files / entry.path, target)
    record: dict[str, Any] = {
        "files": manifest.to_json_obj(),
        "missing": list(manifest.missing),
        "skipped": list(manifest.skipped),
        "left": None if manifest.left is None else manifest.left.to_json_obj(),
    }
    if not complete:
        record["complete"] = False
    (out / MANIFEST_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _keep_arrived(spool: BinaryIO, files: Path, out: Path, gzip: bool) -> Manifest:
    """A fetch cut short: extract what the spool holds, and keep in `out` every file that
    fully arrived with the sha256 the VM vouched for; the cut file is left out. Best
    effort: a disk that refuses (the cut may be its doing) keeps nothing more, and the
    error that cut the fetch is the one the caller raises, never this one."""
    try:
        return _extract_arrived(spool, files, out, gzip)
    except OSError:
        return Manifest(())


def _extract_arrived(spool: BinaryIO, files: Path, out: Path, gzip: bool) -> Manifest:
    done = _Unpacked([], {})
    files.mkdir(exist_ok=True)
    # What arrived is what reached the spool's file: its buffer's tail goes there first,
    # unless the disk refuses it (then that tail is part of the cut), and the file is
    # read through a handle of its own, since the writer's seek would flush (and fail)
    # again.
    with contextlib.suppress(OSError):
        spool.flush()
    # The cut shows up as whatever the truncated stream raises: stop there.
    cut = (tarfile.TarError, EOFError, OSError, ValueError, KeyError, TypeError, RemoteError)
    with open(spool.name, "rb") as arrived, contextlib.suppress(*cut):
        _unpack_local(arrived, files, gzip, done)
    kept = tuple(entry for entry in done.written if done.vouched.get(entry.path) == entry.sha256)
    manifest = Manifest.from_json_obj(Manifest(kept).to_json_obj())
    if manifest.entries:
        _place(files, out, manifest, complete=False)
    return manifest


def fetch_artifacts(
    shell: StreamShell,
    *,
    workspace: str,
    patterns: Sequence[str],
    run_dir: str,
    log_path: str,
    out: Path,
    max_bytes: int = DEFAULT_MAX_FETCH,
    status_path: str | None = None,
    timeout: float,
    python: str = "python3",
    gzip: bool = False,
    kept: Callable[[Manifest], None] | None = None,
) -> Manifest:
    """Bring the patterns, the run directory and the log back into `out`; the checked
    manifest (also written to `out/manifest.json`). Patterns, a run directory or a log
    that are not there are listed in `missing`, not fatal. With `status_path` (the
    launcher's status file) the manifest's `left` counts what the command wrote in the
    workspace that the fetch does not bring.

    RemoteError when the VM refuses (over `max_bytes`: its message lists the largest
    entries) or what arrived differs from the VM's manifest; nothing lands in `out` then.
    When the stream itself is cut short (any exception while it flows, a signal's
    included, or the VM's packer failing), the files that fully arrived and were
    vouched for are kept in `out` (`kept` hears of them) and the error propagates.
    """
    if posixpath.basename(log_path.rstrip("/")) in ("", MANIFEST_FILE, "run", "workspace"):
        raise WorkspaceError(
            f"The log path {log_path!r} would collide with the fetch layout in {out}"
        )
    argv = fetch_command(
        workspace=workspace,
        patterns=patterns,
        run_dir=run_dir,
        log_path=log_path,
        max_bytes=max_bytes,
        status_path=status_path,
        python=python,
        gzip=gzip,
    )
    # Staged beside `out` (same filesystem, so files move with os.replace) and `out` made
    # only once something verified arrived: a dry run, whose plan ends at this stream,
    # and a refused fetch leave no empty --out directory behind.
    # Every OSError below is this machine's own (the SSH layer maps its own): a full disk
    # is ArtifactWriteError, not a traceback or a "connection failed".
    try:
        staging = Path(tempfile.mkdtemp(prefix=".tpulab-fetch-", dir=_existing_ancestor(out)))
    except OSError as error:
        raise _unwritable(out, error) from None
    try:
        return _fetch_into(shell, argv, staging, out, max_bytes, timeout, gzip, kept)
    except OSError as error:
        raise _unwritable(out, error) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fetch_into(
    shell: StreamShell,
    argv: list[str],
    staging: Path,
    out: Path,
    max_bytes: int,
    timeout: float,
    gzip: bool,
    kept: Callable[[Manifest], None] | None,
) -> Manifest:
    """fetch_artifacts' stream, spooled and checked in `staging`, then placed in `out`."""
    handle = (staging / "archive.tar").open("w+b")
    try:
        spool = _CappedSpool(handle, max_bytes + _FETCH_OVERHEAD, out)
        try:
            result = shell.run_streaming(
                argv,
                stdin=None,
                stdout=cast(BinaryIO, spool),  # write() is all a StreamShell uses
                timeout=timeout,
            )
        except BaseException:
            if spool.size <= spool.limit:  # cut short, not a VM past the cap
                _report_kept(kept, _keep_arrived(handle, staging / "files", out, gzip))
            raise
        if result.exit_status != 0:
            _report_kept(kept, _keep_arrived(handle, staging / "files", out, gzip))
            raise RemoteError(
                f"The VM did not send the artifacts: {_refusal(result)}",
                hint="Over the cap: raise --max-fetch or narrow --fetch."
                if result.exit_status == _REFUSED
                else "Retry; check the VM's disk and its python3.",
            )
        handle.seek(0)
        files = staging / "files"
        files.mkdir()
        done = _Unpacked([], {})
        try:
            _unpack_local(handle, files, gzip, done)
        except (tarfile.TarError, EOFError, ValueError, KeyError, TypeError) as exc:
            raise RemoteError(
                f"The fetched archive is damaged ({type(exc).__name__}: {exc}); nothing was kept"
            ) from exc
    finally:
        # Closing flushes what the buffer still holds: on a full disk that raises, and it
        # must not replace the error (or the Ctrl-C) already on its way out. On success
        # nothing is pending: the unpack read the spool back from its start.
        with contextlib.suppress(OSError):
            handle.close()
    claimed = done.claimed
    if claimed is None:
        raise RemoteError("The fetched archive has no manifest (cut short?); nothing was kept")
    written = Manifest.from_json_obj(Manifest(tuple(done.written)).to_json_obj())
    if claimed.entries != written.entries:
        raise RemoteError(
            "The fetched artifacts differ from the VM's manifest: "
            + _differences(claimed, written)
            + "; nothing was kept",
            hint="Retry the fetch; a file still being written on the VM changes under the packer.",
        )
    manifest = Manifest(written.entries, claimed.missing, claimed.skipped, claimed.left)
    _place(files, out, manifest, complete=True)
    return manifest


def _report_kept(kept: Callable[[Manifest], None] | None, manifest: Manifest) -> None:
    if kept is not None and manifest.entries:
        kept(manifest)
