"""The workspace goes up and the artifacts come back, each as ONE streamed tar archive.

Pure Python, no paramiko: the archive is written to (and read from) a `StreamShell`,
which `tpulab.remote.ssh.Connection` implements over one SSH channel. The remote half is
`remote_payloads/transfer.py` (stdlib only, Python 3.10), run as `python3 -c <source>`
so that nothing has to be staged first.

Upload, `upload_workspace`:
    laptop: `select_workspace` (ignore rules, secrets, cap; before anything is created)
            -> tar stream (one pass: each file hashed as it is archived)
            -> trailer: the archive's sha256
    VM:     `transfer.py unpack`: extracts into a staging directory next to `remote_dir`
            (no absolute names, no `..`, no links, no devices), checks the trailer and
            each file, then swaps the staging directory in for `remote_dir` and prints
            its manifest; the laptop's manifest must equal it.

Fetch, `fetch_artifacts`:
    VM:     `transfer.py pack`: globs the patterns inside the workspace, adds the run
            directory and the log, refuses over the cap BEFORE sending (listing the
            largest entries), streams the tar; its last member is the manifest
            (path, bytes, sha256), hashed as each file was read.
    laptop: spools the stream (counted against the cap), extracts safely into `out`,
            checks every file against the manifest, writes `out/manifest.json`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from tpulab.errors import WorkspaceError
from tpulab.remote.bootstrap import CommandResult

__all__ = [
    "ALWAYS_EXCLUDED",
    "DEFAULT_MAX_FETCH",
    "DEFAULT_MAX_UPLOAD",
    "Manifest",
    "ManifestEntry",
    "StreamShell",
    "UploadSelection",
    "WorkspaceError",
    "check_fetch_patterns",
    "fetch_artifacts",
    "select_workspace",
    "upload_workspace",
]

DEFAULT_MAX_UPLOAD = 256 * 2**20
DEFAULT_MAX_FETCH = 2**30

# Never uploaded, whatever the ignore files say (gitignore syntax; a directory holding a
# `pyvenv.cfg` is a virtualenv whatever its name and is excluded too).
ALWAYS_EXCLUDED: tuple[str, ...] = (
    ".git/",
    ".hg/",
    ".svn/",
    ".venv/",
    "venv/",
    "__pycache__/",
    "*.pyc",
    ".nox/",
    ".tox/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    "tpulab-runs/",
)


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


@dataclass(frozen=True)
class ManifestEntry:
    path: str  # posix, relative to the archive's root
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    entries: tuple[ManifestEntry, ...]
    missing: tuple[str, ...] = ()  # fetch patterns that matched nothing

    @property
    def total_bytes(self) -> int:
        return sum(entry.bytes for entry in self.entries)

    @property
    def count(self) -> int:
        return len(self.entries)

    def to_json_obj(self) -> list[dict[str, Any]]:
        return [
            {"path": entry.path, "bytes": entry.bytes, "sha256": entry.sha256}
            for entry in self.entries
        ]

    @classmethod
    def from_json_obj(cls, obj: object, *, missing: Sequence[str] = ()) -> Manifest:
        raise NotImplementedError


@dataclass(frozen=True)
class UploadSelection:
    root: Path
    files: tuple[tuple[str, int], ...]  # (posix path relative to root, size in bytes)
    total_bytes: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count

    def largest(self, n: int = 10) -> list[tuple[str, int]]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


def select_workspace(
    root: Path,
    *,
    max_bytes: int = DEFAULT_MAX_UPLOAD,
    allow_secrets: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> UploadSelection:
    """The files of `root` that go up; validation only (reads the tree, never the
    network). WorkspaceError for a missing root, an upload over `max_bytes`, or a
    secret-looking file that `allow_secrets` does not name."""
    raise NotImplementedError


def check_fetch_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    """`--fetch` patterns, normalised; WorkspaceError for empty, absolute or `..`."""
    raise NotImplementedError


def upload_workspace(
    shell: StreamShell,
    selection: UploadSelection,
    remote_dir: str,
    *,
    timeout: float,
    python: str = "python3",
) -> Manifest:
    """Replace `remote_dir` on the VM with the selected files; their checked manifest."""
    raise NotImplementedError


def fetch_artifacts(
    shell: StreamShell,
    *,
    workspace: str,
    patterns: Sequence[str],
    run_dir: str,
    log_path: str,
    out: Path,
    max_bytes: int = DEFAULT_MAX_FETCH,
    timeout: float,
    python: str = "python3",
) -> Manifest:
    """Bring the patterns, the run directory and the log back into `out`; the checked
    manifest (also written to `out/manifest.json`)."""
    raise NotImplementedError
