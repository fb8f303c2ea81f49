"""What a transfer moved, as the VM's packer and the laptop both state it.

A manifest is the (path, bytes, sha256) of each file, plus what a fetch has to say
about what it did not bring: the patterns that matched nothing, the links it left out
for leading out of the workspace, and the files the command wrote in the workspace that
no pattern asked for (`LeftBehind`: on an ephemeral run they go with the VM).
`remote_payloads/transfer.py` writes the same shapes as JSON.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpulab.remote.selection import first_few, human_size

__all__ = ["LeftBehind", "Manifest", "ManifestEntry"]


@dataclass(frozen=True)
class ManifestEntry:
    path: str  # posix, relative to the archive's root
    bytes: int
    sha256: str


@dataclass(frozen=True)
class LeftBehind:
    """Files the command wrote (or rewrote) in the workspace that the fetch did not bring,
    as the VM's packer counted them: their number and bytes, the first few paths (in its
    walk's order: a directory's files, then its subdirectories', each by name),
    and whether it looked at the whole workspace (`complete`; else "at least")."""

    files: int
    bytes: int
    first: tuple[str, ...]
    complete: bool = True

    def describe(self, *, gone: bool | None = None) -> str:
        """ "3 files (1.2 KiB) your command wrote in the workspace were not fetched: out/a,
        out/b, out/c; --fetch 'out/**' brings them"; with `gone`, whether they went with
        the VM ("... not fetched and went with the VM: ...") or stay there (and a
        session's next sync keeps them); None says neither (not known yet)."""
        count = f"{self.files}" if self.complete else f"at least {self.files}"
        noun = "file" if self.files == 1 else "files"
        verb = "was" if self.files == 1 and self.complete else "were"
        patterns = self.patterns()
        fetch = " ".join(f"--fetch {pattern}" for pattern in patterns)
        went = {True: " and went with the VM", False: " (they stay in the workspace on the VM)"}
        where = "" if gone is None else went[gone]
        return (
            f"{count} {noun} ({human_size(self.bytes)}) your command wrote in the workspace "
            f"{verb} not fetched{where}: {first_few(self.first)}"
            + (f"; {fetch} brings them" if patterns else "")
        )

    def patterns(self) -> list[str]:
        """--fetch patterns that would bring the named files: each one's top directory
        (`'out/**'`), or the file itself when it is at the top; none for a name a
        terminal cannot show as typed (a newline in it)."""
        found: list[str] = []
        for path in self.first:
            top, _, rest = path.partition("/")
            if not top.isprintable() or "'" in top:
                continue  # not something to paste between single quotes
            pattern = f"'{top}/**'" if rest else f"'{path}'"
            if pattern not in found:
                found.append(pattern)
        return found[:3]

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "first": list(self.first),
            "complete": self.complete,
        }

    @classmethod
    def from_json_obj(cls, obj: object) -> LeftBehind | None:
        """The packer's `left` (None: it said nothing, the command never having started);
        ValueError when malformed."""
        if obj is None:
            return None
        if not isinstance(obj, dict) or set(obj) != {"files", "bytes", "first", "complete"}:
            raise ValueError(f"malformed 'left' in a fetch manifest: {obj!r:.100}")
        files, size, first, complete = obj["files"], obj["bytes"], obj["first"], obj["complete"]
        counts = (files, size)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
            raise ValueError(f"malformed 'left' in a fetch manifest: {obj!r:.100}")
        if not isinstance(first, list) or not all(isinstance(p, str) for p in first):
            raise ValueError(f"malformed 'left' in a fetch manifest: {obj!r:.100}")
        if not isinstance(complete, bool):
            raise ValueError(f"malformed 'left' in a fetch manifest: {obj!r:.100}")
        return cls(files, size, tuple(first), complete)


@dataclass(frozen=True)
class Manifest:
    entries: tuple[ManifestEntry, ...]
    missing: tuple[str, ...] = ()  # what a fetch asked for and did not find
    # Links a fetch left out because they lead out of the workspace (or the run
    # directory): "workspace/link -> where it leads", as the VM saw them.
    skipped: tuple[str, ...] = ()
    left: LeftBehind | None = None  # what the command wrote and the fetch did not bring

    @property
    def total_bytes(self) -> int:
        return sum(entry.bytes for entry in self.entries)

    @property
    def count(self) -> int:
        return len(self.entries)

    def describe_skipped(self) -> str:
        """The fetch summary's words for `skipped`, as the upload's name what it skipped."""
        if not self.skipped:
            return ""
        noun = "link" if len(self.skipped) == 1 else "links"
        return f"; skipped {len(self.skipped)} {noun} leading out of the workspace: " + first_few(
            self.skipped
        )

    def describe_left(self) -> str:
        """The fetch summary's words for `left`, when the command wrote files it left."""
        if self.left is None or not self.left.files:
            return ""
        return "; " + self.left.describe()

    def to_json_obj(self) -> list[dict[str, Any]]:
        return [
            {"path": entry.path, "bytes": entry.bytes, "sha256": entry.sha256}
            for entry in self.entries
        ]

    @classmethod
    def from_json_obj(
        cls,
        obj: object,
        *,
        missing: Sequence[str] = (),
        skipped: Sequence[str] = (),
        left: object = None,
    ) -> Manifest:
        """The inverse of `to_json_obj`, sorted by path; ValueError when malformed."""
        if not isinstance(obj, list):
            raise ValueError(f"a manifest is a list of entries, got {type(obj).__name__}")
        entries: list[ManifestEntry] = []
        for item in obj:
            if not isinstance(item, dict) or set(item) != {"path", "bytes", "sha256"}:
                raise ValueError(f"malformed manifest entry {str(item)[:100]}")
            path, size, digest = item["path"], item["bytes"], item["sha256"]
            if not isinstance(path, str) or not isinstance(size, int) or size < 0:
                raise ValueError(f"malformed manifest entry {str(item)[:100]}")
            if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ValueError(f"malformed sha256 in manifest entry for {path!r}")
            entries.append(ManifestEntry(path, size, digest))
        entries.sort(key=lambda entry: entry.path)
        for named in (missing, skipped):
            if isinstance(named, str) or not all(isinstance(item, str) for item in named):
                raise ValueError(
                    f"a manifest's missing and skipped are lists of text: {named!r:.100}"
                )
        return cls(tuple(entries), tuple(missing), tuple(skipped), LeftBehind.from_json_obj(left))
