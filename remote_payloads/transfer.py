"""The VM's half of tpulab's workspace transfers (stdlib only; runs on Python 3.10).

Run as `python3 -c <this source> manifest DEST`, `... unpack DEST [--gzip] [--keep]` or
`... pack [options] -- PATTERN...` (nothing is staged first). Every remote path may be
absolute, `~/x` or relative to the login directory.

manifest prints `{"manifest": [{"path", "bytes", "sha256"}, ...]}` of the regular files
        under DEST as they are NOW, hashed from their bytes (never remembered: the user's
        command may have changed them); links and other non-regular files are left out
        (they are never kept, so they are sent); an absent DEST is `[]`. Only the files
        the last unpack placed (its record beside DEST, `.<DEST>.tpulab-synced.json`)
        are listed when there is a record: what commands wrote is not the laptop's.
unpack  reads a tar from stdin followed by a trailer `TPULAB-ARCHIVE-SHA256:<64 hex>`
        (the sha256 of every byte before it); extracts it into a staging directory next to
        DEST, refusing absolute names, `..`, links, devices and duplicates; checks the
        trailer; hard-links into the staging directory what commands wrote in DEST
        (every entry the last unpack's record does not name and the archive does not
        hold: a session's checkpoints survive its next sync); then swaps the staging
        directory in for DEST (what the last sync placed and the laptop no longer has
        goes), records what this one placed (path -> [sha256, bytes]), and prints
        `{"manifest": [{"path", "bytes", "sha256"}, ...], "removed": N, "carried":
        {"files", "bytes"}, "replaced": {"files", "dir", "first"}}` on stdout. A synced
        file that changed on the VM since (a command, an editor, Jupyter) and that this
        sync replaces or
        removes is first hard-linked into `replaced/<UTC time>/` beside DEST: the
        laptop's copy wins, the VM's is never lost. Without a record (a first sync, or a
        DEST an older tpulab wrote) everything the archive does not replace is
        carried: what the laptop deleted stays that once, rather than guessing wrong
        about a command's files.
        With --keep the first member is `.tpulab-keep.json`, `{"keep": [{"path", "bytes",
        "sha256", "mode", "mtime"}, ...]}`: files to take from the current DEST instead of
        the archive. Each is COPIED into the staging directory and hashed as it is read;
        one that is gone, behind a link, or whose bytes differ from the listed sha256 is
        refused (stale bytes are never kept). A copy, not a hard link: the staging copy is
        a fresh inode nothing else can hold, whereas a link would share it with whatever
        else still names or has it open (another link the command made, a process it left
        running), which could change the kept bytes after they were checked. The printed
        manifest covers both the extracted and the kept files.
pack    globs the patterns inside --workspace (never outside it: a match whose real path
        leaves the workspace is skipped, and the link it leaves through is named), adds
        everything under --run-dir as `run/...` and --log as its basename, matches as
        `workspace/<path>`; over --max-bytes it refuses BEFORE writing anything, naming
        the largest entries; else streams a tar on stdout whose last member,
        `.tpulab-manifest.json`, lists each file's bytes and sha256 as read, the patterns
        that matched nothing (`missing`) and the links skipped for leaving the workspace
        (`skipped`, "link -> where it leads"). Each member's PAX header also
        carries the sha256 of the file before it (`TPULAB.prev.sha256`), so a stream cut
        short still vouches for every file that fully arrived before the cut. The log is
        never read through a link (a command that replaced it with one gets it listed as
        missing), as nothing under the run directory is read outside it.
        With `--status S --exclude RULES` (the launcher's status file, and the upload's
        always-excluded rules as a JSON list) the manifest's `left` says what the command
        wrote in the workspace that the fetch does not bring: `{"files", "bytes",
        "first": [the first few paths], "complete"}` (files whose ctime is not before the
        status's `launched_at`; excluded directories and virtualenvs are not walked;
        `complete` is false when the walk stopped at LEFT_LOOKED_MAX files); null when
        the command never started.

Exit status: 0 done, 2 bad arguments, 3 refused (the reason on stderr, one line).
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import tarfile
import time
from typing import BinaryIO, NamedTuple

TRAILER_PREFIX = b"TPULAB-ARCHIVE-SHA256:"
TRAILER_LEN = len(TRAILER_PREFIX) + 64
MANIFEST_MEMBER = ".tpulab-manifest.json"
PREV_SHA256 = "TPULAB.prev.sha256"  # PAX key: the previous file member's sha256
KEEP_MEMBER = ".tpulab-keep.json"
KEEP_LIST_MAX = 64 * 2**20  # a keep list is ~150 bytes a file; past this it is not one
CHUNK = 1 << 20
REFUSED = 3


class Refused(Exception):
    """The transfer cannot go on; the message says why."""


def _resolve(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def _safe_name(name: str) -> str:
    """A member name as a relative path that stays inside the destination."""
    if not name or name.startswith("/") or "\\" in name or "\0" in name:
        raise Refused(f"archive member {name!r} is not a relative path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or any(part == ".." for part in parts):
        raise Refused(f"archive member {name!r} would escape the destination")
    return "/".join(parts)


# -- unpack ---------------------------------------------------------------------------


class TrailerReader(io.RawIOBase):
    """Passes a stream through minus its last TRAILER_LEN bytes, hashing what it passes."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self._held = b""
        self._pos = 0  # bytes of _held already passed on (slicing per read is O(n^2))
        self._eof = False
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = len(buffer)
        if len(self._held) - self._pos < want + TRAILER_LEN and not self._eof:
            parts = [self._held[self._pos :]]
            size = len(parts[0])
            while size < want + TRAILER_LEN:
                chunk = self._raw.read(CHUNK)
                if not chunk:
                    self._eof = True
                    break
                parts.append(chunk)
                size += len(chunk)
            self._held, self._pos = b"".join(parts), 0
        n = min(want, max(0, len(self._held) - self._pos - TRAILER_LEN))
        data = self._held[self._pos : self._pos + n]
        self._pos += n
        buffer[:n] = data
        self.digest.update(data)
        return n

    def trailer(self) -> bytes:
        while self.readinto(memoryview(bytearray(CHUNK))):
            pass  # the tar's end padding still counts towards the digest
        return self._held[self._pos :]


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> dict[str, object]:
    source = tar.extractfile(member)
    if source is None:
        raise Refused(f"archive member {member.name!r} has no data")
    digest = hashlib.sha256()
    size = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o755 if member.mode & 0o111 else 0o644)
    with os.fdopen(fd, "wb") as out:
        for chunk in iter(lambda: source.read(CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    os.utime(path, (member.mtime, member.mtime))
    return {"path": member.name, "bytes": size, "sha256": digest.hexdigest()}


def _extract(
    stream: io.RawIOBase, staging: str, gzip: bool, kept_from: str | None, kept: set[str]
) -> list[dict[str, object]]:
    """Write the archive's files (and, with `kept_from`, the kept ones its first member
    lists, copied from there, their paths added to `kept`) into `staging`; the manifest
    of what was written."""
    manifest: list[dict[str, object]] = []
    seen: set[str] = set()
    made: set[str] = {staging}  # makedirs per file costs a failing mkdir syscall each
    with tarfile.open(fileobj=stream, mode="r|gz" if gzip else "r|") as tar:
        members = iter(tar)
        if kept_from is not None:
            first = next(members, None)
            if first is None or first.name != KEEP_MEMBER or not first.isreg():
                raise Refused(f"--keep was given but the archive does not start with {KEEP_MEMBER}")
            real_dest = os.path.realpath(kept_from)
            for entry in _keep_list(tar, first):
                if entry.path in seen:
                    raise Refused(f"kept file {entry.path!r} is listed twice")
                seen.add(entry.path)
                kept.add(entry.path)
                target = os.path.join(staging, entry.path)
                _make_parent(target, made)
                manifest.append(_copy_kept(kept_from, real_dest, entry, target))
        for member in members:
            name = _safe_name(member.name)
            if name in seen:
                raise Refused(f"archive member {name!r} appears twice")
            seen.add(name)
            target = os.path.join(staging, name)
            if member.isdir():
                os.makedirs(target, exist_ok=True)
                made.add(target)
            elif member.isreg():
                _make_parent(target, made)
                member.name = name
                manifest.append(_write_member(tar, member, target))
            else:
                raise Refused(f"archive member {name!r} is not a regular file or directory")
    return manifest


def _make_parent(target: str, made: set[str]) -> None:
    parent = os.path.dirname(target)
    if parent not in made:
        os.makedirs(parent, exist_ok=True)
        made.add(parent)


# -- kept files -----------------------------------------------------------------------


class Kept(NamedTuple):
    """A file the laptop did not send because DEST holds it already, as it should be."""

    path: str
    bytes: int
    sha256: str
    mode: int
    mtime: int


def _keep_list(tar: tarfile.TarFile, member: tarfile.TarInfo) -> list[Kept]:
    """The entries of the keep member, each checked for shape and a safe path."""
    if member.size > KEEP_LIST_MAX:
        raise Refused(f"{KEEP_MEMBER} is {member.size} bytes, too big for a keep list")
    source = tar.extractfile(member)
    try:
        document = json.loads(source.read() if source is not None else b"")
    except ValueError as exc:
        raise Refused(f"{KEEP_MEMBER} is not JSON: {exc}") from exc
    entries = document.get("keep") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise Refused(f'{KEEP_MEMBER} holds no "keep" list')
    kept: list[Kept] = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != set(Kept._fields):
            raise Refused(f"malformed keep entry {str(entry)[:100]}")
        path, size, digest, mode, mtime = (entry[field] for field in Kept._fields)
        numbers = (size, mode, mtime)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
            raise Refused(f"malformed keep entry {str(entry)[:100]}")
        if not isinstance(path, str) or not isinstance(digest, str) or len(digest) != 64:
            raise Refused(f"malformed keep entry {str(entry)[:100]}")
        kept.append(Kept(_safe_name(path), size, digest, mode, mtime))
    return kept


def _open_regular(path: str) -> io.BufferedReader | None:
    """`path` opened for reading if it is a regular file (not through a final link), else
    None. O_NONBLOCK: opening a FIFO the command left behind must not wait for a writer."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        return None
    return handle


def _hash_copy(source: BinaryIO, out: BinaryIO | None) -> tuple[int, str]:
    """Read `source` to its end (into `out`, if given): its size and sha256."""
    digest = hashlib.sha256()
    size = 0
    for chunk in iter(lambda: source.read(CHUNK), b""):
        digest.update(chunk)
        size += len(chunk)
        if out is not None:
            out.write(chunk)
    return size, digest.hexdigest()


def _copy_kept(dest: str, real_dest: str, kept: Kept, target: str) -> dict[str, object]:
    """Copy DEST/path to `target`, hashing what is read; refused unless it is the
    regular file, with the bytes and sha256, that the laptop decided to keep."""
    source = os.path.join(dest, kept.path)
    if _real(source) != os.path.join(real_dest, kept.path):
        raise Refused(f"kept file {kept.path!r} is behind a link in {dest}")
    handle = _open_regular(source)
    if handle is None:
        raise Refused(f"kept file {kept.path!r} is no longer a regular file in {dest}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    mode = 0o755 if kept.mode & 0o111 else 0o644
    with handle, os.fdopen(os.open(target, flags, mode), "wb") as out:
        size, digest = _hash_copy(handle, out)
    if size != kept.bytes or digest != kept.sha256:
        raise Refused(
            f"kept file {kept.path!r} changed on the VM after its manifest was read "
            f"({size} bytes, sha256 {digest[:12]}...; the laptop expected "
            f"{kept.bytes} bytes, sha256 {kept.sha256[:12]}...); nothing was replaced"
        )
    os.utime(target, (kept.mtime, kept.mtime))
    return {"path": kept.path, "bytes": size, "sha256": digest}


# -- what the syncs put in DEST, and what the commands wrote there --------------------


def _synced_record(dest: str) -> str:
    """Beside DEST, never in it: the paths the last sync placed in DEST."""
    return os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.tpulab-synced.json")


def _synced(dest: str) -> dict[str, tuple[str, int]] | None:
    """What the last sync placed in DEST: path -> (sha256, bytes) as placed; None when
    there is no record (a first sync, or a DEST an older tpulab synced): then DEST is
    taken as all synced."""
    try:
        with open(_synced_record(dest), encoding="utf-8") as handle:
            placed = json.load(handle).get("synced")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(placed, dict):
        return None
    record: dict[str, tuple[str, int]] = {}
    for path, value in placed.items():
        if not (isinstance(value, list) and len(value) == 2):
            return None
        digest, size = value
        if not isinstance(digest, str) or not isinstance(size, int):
            return None
        record[path] = (digest, size)
    return record


def _entries_of(dest: str) -> list[str]:
    """Every non-directory under `dest` (files, links, FIFOs; a link to a directory is
    one entry, never walked into), by relative path, in walk order."""
    found: list[str] = []
    for top, dirs, files in os.walk(dest):  # os.walk never descends into a linked dir
        dirs.sort()
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        for name in sorted([*files, *links]):
            found.append(os.path.relpath(os.path.join(top, name), dest).replace(os.sep, "/"))
    return found


def _carry(dest: str, synced: dict[str, tuple[str, int]], staging: str) -> dict[str, int]:
    """Hard-link into `staging` what the commands wrote in DEST (anything the last sync
    did not place there) unless the new archive has that path: a session's next sync
    keeps a command's checkpoints and results, and still removes what the laptop
    deleted. Links, not copies: no bytes are read or doubled, and DEST stays whole until
    the swap, so a failure before it loses nothing. A path the archive took over (its
    parent now a file, say) is dropped with the old copy."""
    files = size = 0
    for rel in _entries_of(dest):
        target = os.path.join(staging, rel)
        if rel in synced or os.path.lexists(target):
            continue
        parent = os.path.dirname(target)
        try:
            os.makedirs(parent, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            continue  # the archive has a file where this needs a directory: it wins
        source = os.path.join(dest, rel)
        _link_or_copy(source, target)
        files += 1
        size += os.lstat(target).st_size
    return {"files": files, "bytes": size}


def _lexists(dest: str, rel: str) -> bool:
    return os.path.lexists(os.path.join(dest, rel))


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:  # a filesystem without hard links: copy (a link as a link)
        shutil.copy2(source, target, follow_symlinks=False)


def _changed_since_synced(
    dest: str, synced: dict[str, tuple[str, int]], kept: set[str], written: dict[str, str]
) -> list[str]:
    """The synced files this unpack replaces or removes that changed on the VM since
    the sync placed them (a command, an editor, Jupyter saving a notebook), unless they
    already hold what replaces them. Kept files are taken as they are: never at risk."""
    changed: list[str] = []
    for rel, (digest, _size) in sorted(synced.items()):
        if rel in kept:
            continue
        handle = _open_regular(os.path.join(dest, rel))
        if handle is None:
            continue  # gone, or no longer a regular file: no bytes to lose
        with handle:
            now = _hash_copy(handle, None)[1]
        if now != digest and now != written.get(rel):
            changed.append(rel)
    return changed


def _set_aside(dest: str, changed: list[str]) -> dict[str, object]:
    """Hard-link each changed file into `replaced/<UTC time>/` beside DEST (outside the
    workspace, so no later sync touches it) before the swap drops it."""
    if not changed:
        return {"files": 0, "dir": None, "first": []}
    parent = os.path.dirname(dest)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = os.path.join(parent, "replaced", stamp)
    if os.path.lexists(aside):
        aside += f"-{os.getpid()}"
    for rel in changed:
        target = os.path.join(aside, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _link_or_copy(os.path.join(dest, rel), target)
    home = os.path.expanduser("~").rstrip("/") + "/"
    shown = "~/" + aside[len(home) :] if aside.startswith(home) else aside
    return {"files": len(changed), "dir": shown, "first": changed[:LEFT_NAMED]}


def _write_synced(dest: str, written: list[dict[str, object]]) -> str:
    """The record of this sync, written beside DEST as a temporary file; renamed into
    place once DEST is swapped in (a crash between leaves the previous record: a file the
    laptop deleted may then stay, but nothing a command wrote is lost)."""
    partial = _synced_record(dest) + f".{os.getpid()}"
    placed = {str(entry["path"]): [entry["sha256"], entry["bytes"]] for entry in written}
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump({"synced": placed}, handle, sort_keys=True)
    return partial


def _manifest_of(
    dest: str, only: dict[str, tuple[str, int]] | None = None
) -> list[dict[str, object]]:
    """The regular files under `dest` (links not followed), hashed from their bytes;
    with `only`, just those paths (what the last sync placed: the laptop diffs its
    selection against them, and a command's own gigabytes are never hashed for it)."""
    entries: list[dict[str, object]] = []
    for top, dirs, files in os.walk(dest):  # os.walk never descends into a linked dir
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            rel = os.path.relpath(path, dest).replace(os.sep, "/")
            if only is not None and rel not in only:
                continue
            handle = _open_regular(path)
            if handle is None:
                continue  # a link, a FIFO, unreadable: not listed, so sent rather than kept
            with handle:
                size, digest = _hash_copy(handle, None)
            entries.append({"path": rel, "bytes": size, "sha256": digest})
    entries.sort(key=lambda entry: str(entry["path"]))
    return entries


def _checked_dest(dest: str) -> str:
    dest = _resolve(dest)
    home = os.path.realpath(os.path.expanduser("~"))
    if _inside(home, dest) or _inside(os.getcwd(), dest):
        # The whole directory is replaced: never the login's home (its .ssh) or above.
        raise Refused(f"{dest} is the login directory or one of its parents")
    if os.path.lexists(dest) and (os.path.islink(dest) or not os.path.isdir(dest)):
        raise Refused(f"{dest} exists and is not a directory")
    return dest


def manifest(dest: str) -> None:
    dest = _checked_dest(dest)
    entries = _manifest_of(dest, _synced(dest)) if os.path.isdir(dest) else []
    sys.stdout.write(json.dumps({"manifest": entries}) + "\n")


def unpack(dest: str, gzip: bool, keep: bool) -> None:
    dest = _checked_dest(dest)
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(dest)
    staging = os.path.join(parent, f".{base}.tpulab-new-{os.getpid()}")
    old = os.path.join(parent, f".{base}.tpulab-old-{os.getpid()}")
    os.mkdir(staging, 0o755)
    record: str | None = None
    try:
        reader = TrailerReader(sys.stdin.buffer)
        kept: set[str] = set()
        try:
            written = _extract(reader, staging, gzip, dest if keep else None, kept)
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            raise Refused(f"the archive is damaged: {type(exc).__name__}: {exc}") from exc
        trailer = reader.trailer()
        if not trailer.startswith(TRAILER_PREFIX):
            raise Refused("the archive has no sha256 trailer (the stream was cut short)")
        sent = trailer[len(TRAILER_PREFIX) :].decode("ascii", "replace")
        received = reader.digest.hexdigest()
        if sent != received:
            raise Refused(f"the archive is corrupt: sha256 {received}, sent {sent}")
        carried = {"files": 0, "bytes": 0}
        replaced = _set_aside(dest, [])
        removed = 0
        if os.path.isdir(dest):
            # No record (an older tpulab synced DEST): whatever the archive does not
            # replace is kept, as the safe guess; a file the laptop deleted may stay.
            synced = _synced(dest) or {}
            carried = _carry(dest, synced, staging)
            new = {str(entry["path"]): str(entry["sha256"]) for entry in written}
            replaced = _set_aside(dest, _changed_since_synced(dest, synced, kept, new))
            removed = sum(1 for path in synced if path not in new and _lexists(dest, path))
        record = _write_synced(dest, written)
        if os.path.isdir(dest):
            os.rename(dest, old)
        os.rename(staging, dest)
        os.replace(record, _synced_record(dest))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        if record is not None and os.path.exists(record):
            os.remove(record)  # refused before the swap: the previous record stands
    written.sort(key=lambda entry: str(entry["path"]))
    answer = {"manifest": written, "removed": removed, "carried": carried, "replaced": replaced}
    sys.stdout.write(json.dumps(answer) + "\n")


# -- pack -----------------------------------------------------------------------------


# Directories' real paths, resolved once per process: `os.path.realpath` lstats every
# component of every path it is given, which for 20,000 files in one directory was most
# of a pack's time. A file's real path is its directory's plus its name, unless the file
# itself is a link (one lstat).
_REAL_DIRS: dict[str, str] = {}


def _real(path: str) -> str:
    """`os.path.realpath(path)`, its directory's part resolved once per process."""
    parent, name = os.path.split(os.path.abspath(path))
    if not name:  # the root directory
        return parent
    joined = os.path.join(_real_dir(parent), name)
    return os.path.realpath(joined) if os.path.islink(joined) else joined


def _real_dir(directory: str) -> str:
    """A directory's real path, resolved once per process."""
    directory = os.path.abspath(directory)
    real = _REAL_DIRS.get(directory)
    if real is None:
        real = _REAL_DIRS[directory] = os.path.realpath(directory)
    return real


def _inside(path: str, root: str) -> bool:
    real, real_root = _real(path), _real_dir(root)
    return real == real_root or real.startswith(real_root.rstrip("/") + "/")


def _leaving_link(path: str, root: str, area: str) -> str:
    """How `path` (under `root` by name, outside it for real) leaves `root`: the first
    link on its way that leads out, as "AREA/link -> where it leads" (AREA/ being where
    `root`'s files land under --out)."""
    parts = os.path.relpath(path, root).split(os.sep)
    for depth in range(1, len(parts) + 1):
        step = os.path.join(root, *parts[:depth])
        if not _inside(step, root):
            return f"{area}/{'/'.join(parts[:depth])} -> {os.path.realpath(step)}"
    return f"{area}/{'/'.join(parts)}"  # not reached while `path` is outside


def _files_under(directory: str, root: str, area: str, skipped: set[str]) -> list[str]:
    """Regular files under `directory` (inside `root`), in os.walk's order: a link to a
    file is followed while it stays in `root`, one that leaves it is added to `skipped`,
    a link to a directory is never walked into. Only links are resolved: an entry of a
    directory inside `root` that is no link is inside too (scandir's types, no stat)."""
    found: list[str] = []
    pending = [directory]
    while pending:
        top = pending.pop()
        try:
            entries = sorted(os.scandir(top), key=lambda entry: entry.name)
        except OSError:  # gone meanwhile, or unreadable: nothing to bring from it
            continue
        subdirs: list[str] = []
        for entry in entries:
            if entry.is_symlink():
                if not _inside(entry.path, root):
                    skipped.add(_leaving_link(entry.path, root, area))
                elif os.path.isfile(entry.path):
                    found.append(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                found.append(entry.path)
        pending.extend(reversed(subdirs))
    return found


def _select(
    workspace: str, patterns: list[str], run_dir: str, log: str
) -> tuple[dict[str, str], list[str], list[str]]:
    """archive name -> local path, what was asked for but not found, and the links
    skipped because they lead out of the workspace."""
    chosen: dict[str, str] = {}
    missing: list[str] = []
    skipped: set[str] = set()
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, root_dir=workspace, recursive=True))
        paths: dict[str, None] = {}  # in order, each once ("out/**" matches out/ and its files)
        for match in matches:
            full = os.path.join(workspace, match)
            # glob answers "absent/**" with "absent/" even when there is no such dir.
            if not os.path.lexists(full):
                continue
            if not _inside(full, workspace):
                skipped.add(_leaving_link(full, workspace, "workspace"))
                continue
            paths.update(
                dict.fromkeys(
                    _files_under(full, workspace, "workspace", skipped)
                    if os.path.isdir(full)
                    else [full]
                )
            )
        for path in paths:
            if os.path.isfile(path):
                rel = os.path.relpath(path, workspace).replace(os.sep, "/")
                chosen["workspace/" + rel] = path
        if not paths:
            missing.append(pattern)
    if os.path.isdir(run_dir):
        for path in _files_under(run_dir, run_dir, "run", skipped):
            chosen["run/" + os.path.relpath(path, run_dir).replace(os.sep, "/")] = path
    else:
        missing.append(run_dir)
    if os.path.isfile(log) and not os.path.islink(log):
        chosen[os.path.basename(log)] = log
    else:
        missing.append(log)
    return chosen, missing, sorted(skipped)


LEFT_NAMED = 5  # files the command wrote and the fetch left, named in its manifest
LEFT_LOOKED_MAX = 200_000  # workspace files looked at for them before the count says "at least"


def _since(status: str) -> float | None:
    """The `launched_at` the launcher left in its status file (the log's ctime just before
    the command started), or None: no status (the command never started), or no stamp."""
    try:
        with open(status, encoding="utf-8") as handle:
            stamp = json.load(handle).get("launched_at")
    except (OSError, ValueError, AttributeError):
        return None
    return float(stamp) if isinstance(stamp, (int, float)) else None


def _excluded(name: str, top: str, excludes: list[str], is_dir: bool) -> bool:
    """`excludes` are the upload's always-excluded rules (`name/` a directory, else a
    file name pattern); a directory holding a pyvenv.cfg is a virtualenv, also left out."""
    if is_dir:
        return name + "/" in excludes or os.path.exists(os.path.join(top, name, "pyvenv.cfg"))
    return any(not rule.endswith("/") and fnmatch.fnmatch(name, rule) for rule in excludes)


def _left_behind(
    workspace: str, since: float, chosen: dict[str, str], excludes: list[str]
) -> dict[str, object]:
    """The workspace's regular files the command wrote (ctime not before `since`) that
    the fetch does not bring: how many, their bytes, the first few (a directory's files
    before its subdirectories', each by name), and whether
    every file was looked at (a huge workspace stops at LEFT_LOOKED_MAX)."""
    fetched = {_real(path) for path in chosen.values()}
    count = size = looked = 0
    first: list[str] = []
    for top, dirs, files in os.walk(workspace):
        dirs[:] = sorted(d for d in dirs if not _excluded(d, top, excludes, True))
        for name in sorted(files):
            looked += 1
            if looked > LEFT_LOOKED_MAX:
                return {"files": count, "bytes": size, "first": first, "complete": False}
            path = os.path.join(top, name)
            try:
                info = os.lstat(path)
            except OSError:  # gone meanwhile
                continue
            if (
                not stat.S_ISREG(info.st_mode)
                or info.st_ctime < since
                or _excluded(name, top, excludes, False)
                or _real(path) in fetched
            ):
                continue
            count += 1
            size += info.st_size
            if len(first) < LEFT_NAMED:
                first.append(os.path.relpath(path, workspace).replace(os.sep, "/"))
    return {"files": count, "bytes": size, "first": first, "complete": True}


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{size} B"
        value /= 1024
    return f"{size} B"


def pack(
    workspace: str,
    patterns: list[str],
    run_dir: str,
    log: str,
    cap: int,
    gzip: bool,
    left: tuple[str, list[str]] | None = None,
) -> None:
    workspace, run_dir, log = _resolve(workspace), _resolve(run_dir), _resolve(log)
    for pattern in patterns:  # the controller checked; a hand-made call gets the same rule
        if pattern.startswith(("/", "~")) or ".." in pattern.split("/"):
            raise Refused(f"fetch pattern {pattern!r} is not inside the workspace")
    chosen, missing, skipped = _select(workspace, patterns, run_dir, log)
    since = None if left is None else _since(_resolve(left[0]))
    behind = None
    if left is not None and since is not None and os.path.isdir(workspace):
        behind = _left_behind(workspace, since, chosen, left[1])
    sizes = {name: os.path.getsize(path) for name, path in chosen.items()}
    total = sum(sizes.values())
    if total > cap:
        largest = sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:10]
        listing = ", ".join(f"{name} ({_human(size)})" for name, size in largest)
        over = f"{_human(total - cap)} over the {_human(cap)} fetch cap"
        if _human(total) == _human(cap):  # "1.0 GiB, over the 1.0 GiB cap" says nothing
            over += f" ({total} bytes against {cap})"
        raise Refused(
            f"the artifacts are {_human(total)} in {len(sizes)} files, {over}; largest: {listing}"
        )
    entries: list[dict[str, object]] = []
    out = sys.stdout.buffer
    vouch: dict[str, str] = {}  # the previous file's sha256, for the next member's header
    with tarfile.open(fileobj=out, mode="w|gz" if gzip else "w|", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(chosen):
            path = chosen[name]
            # Not through a final link: the log is checked above, but the command may
            # still be replacing it (a stop's settle time), so check where it is read.
            is_log = name == os.path.basename(log)
            checked = _open_regular(path) if is_log else None
            if is_log and checked is None:
                missing.append(log)
                continue
            with checked or open(path, "rb") as source:
                opened = os.fstat(source.fileno())
                info = tarfile.TarInfo(name)
                info.size = opened.st_size  # as opened: a file still growing is cut here
                info.mtime = int(opened.st_mtime)
                info.mode = 0o755 if opened.st_mode & 0o111 else 0o644
                info.pax_headers = dict(vouch)
                hashing = _HashingReader(source, info.size)
                tar.addfile(info, hashing)
            vouch = {PREV_SHA256: hashing.hexdigest()}
            entries.append({"path": name, "bytes": info.size, "sha256": hashing.hexdigest()})
        body = json.dumps(
            {"manifest": entries, "missing": missing, "skipped": skipped, "left": behind}
        ).encode()
        info = tarfile.TarInfo(MANIFEST_MEMBER)
        info.size = len(body)
        info.mode = 0o644
        info.pax_headers = dict(vouch)
        tar.addfile(info, io.BytesIO(body))
    out.flush()


class _HashingReader:
    """At most `size` bytes of `source`, hashed as tarfile copies them."""

    def __init__(self, source: io.BufferedReader, size: int) -> None:
        self._source = source
        self._left = size
        self._digest = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._source.read(n)
        if len(data) < n:
            raise Refused(f"{self._source.name} shrank while it was being packed")
        self._left -= len(data)
        self._digest.update(data)
        return data

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


# -- entry point ----------------------------------------------------------------------


def _fail(status: int, message: str) -> None:
    sys.stderr.write(f"transfer: {message}\n")
    sys.exit(status)


def main(argv: list[str]) -> None:
    if argv[:1] == ["manifest"] and len(argv) == 2:
        manifest(argv[1])
        return
    flags = argv[2:]
    known = set(flags) <= {"--gzip", "--keep"} and len(set(flags)) == len(flags)
    if argv[:1] == ["unpack"] and len(argv) >= 2 and known:
        unpack(argv[1], gzip="--gzip" in flags, keep="--keep" in flags)
        return
    if argv[:1] == ["pack"] and "--" in argv:
        split = argv.index("--")
        options, patterns = argv[1:split], argv[split + 1 :]
        values: dict[str, str] = {}
        gzip = "--gzip" in options
        options = [option for option in options if option != "--gzip"]
        if len(options) % 2 or not all(key.startswith("--") for key in options[::2]):
            _fail(2, f"bad pack options {options!r}")
        values = dict(zip(options[::2], options[1::2], strict=True))
        needed = {"--workspace", "--run-dir", "--log", "--max-bytes"}
        optional = {"--status", "--exclude"}  # both or neither
        given = set(values) - needed
        if (
            not needed <= set(values)
            or given not in (set(), optional)
            or not values["--max-bytes"].isdigit()
        ):
            _fail(
                2,
                f"pack needs exactly {sorted(needed)}, and {sorted(optional)} together, "
                f"got {sorted(values)}",
            )
        left = None
        if given:
            try:
                excludes = json.loads(values["--exclude"])
            except ValueError:
                excludes = None
            if not isinstance(excludes, list) or not all(isinstance(r, str) for r in excludes):
                _fail(2, f"--exclude is a JSON list of rules, got {values['--exclude']!r}")
            left = (values["--status"], excludes)
        pack(
            values["--workspace"],
            patterns,
            values["--run-dir"],
            values["--log"],
            int(values["--max-bytes"]),
            gzip,
            left,
        )
        return
    _fail(
        2,
        "usage: manifest DEST | unpack DEST [--gzip] [--keep] | pack OPTIONS -- PATTERN...; "
        f"got {argv!r}",
    )


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Refused as refused:
        _fail(REFUSED, str(refused))
    except OSError as error:  # unreadable file, full disk: one line, not a traceback
        _fail(1, f"{type(error).__name__}: {error}")
