"""Which files of the workspace go up: validated before anything is created.

`select_workspace` walks the tree once: the always-excluded names, the ignore files
(`.gitignore` and `.tpulabignore` at any depth, through `tpulab.remote.ignore`) and
`exclude` patterns decide what is skipped; secret-looking files (by name and by content)
and an upload over the cap are refused with a `WorkspaceError` that says what to do.
Reads the tree, never the network. `tpulab.remote.workspace` sends the result.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tpulab.config.workload import check_workspace_pattern
from tpulab.errors import ConfigError, WorkspaceError
from tpulab.remote.ignore import IgnoreRule, IgnoreRules, parse_ignore_lines

__all__ = [
    "ALWAYS_EXCLUDED",
    "DEFAULT_MAX_UPLOAD",
    "IGNORE_FILE",
    "UploadSelection",
    "check_fetch_patterns",
    "first_few",
    "human_size",
    "over_cap",
    "select_workspace",
]

DEFAULT_MAX_UPLOAD = 256 * 2**20
IGNORE_FILE = ".tpulabignore"

# Never uploaded, whatever the ignore files say (gitignore syntax; a directory holding a
# `pyvenv.cfg` is a virtualenv whatever its name, and one holding tpulab's `run.json` an
# earlier run's --out: both are excluded too).
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


def human_size(size: int) -> str:
    """`size` bytes as people read it: 512 B, 1.5 KiB, 47.7 MiB."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def _count(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def over_cap(total: int, cap: int, what: str = "cap") -> str:
    """By how much `total` bytes exceed `cap`: "12.0 MiB over the 256.0 MiB cap", with
    the exact bytes when both round to the same figure ("300.0 MiB, over the 300.0 MiB
    cap" read as no excess at all)."""
    text = f"{human_size(total - cap)} over the {human_size(cap)} {what}"
    if human_size(total) == human_size(cap):
        text += f" ({_count(total)} bytes against {_count(cap)})"
    return text


@dataclass(frozen=True)
class UploadSelection:
    root: Path
    files: tuple[tuple[str, int], ...]  # (posix path relative to root, size in bytes)
    total_bytes: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    loops: tuple[str, ...] = ()  # symlinks that loop (skipped), named for the user
    # Links skipped because their target is: "link -> target (why)", for the summary.
    skipped_links: tuple[str, ...] = ()

    def largest(self, n: int = 10) -> list[tuple[str, int]]:
        return sorted(self.files, key=lambda item: (-item[1], item[0]))[:n]

    def describe(self) -> str:
        noun = "file" if len(self.files) == 1 else "files"
        text = f"{_count(len(self.files))} {noun}, {human_size(self.total_bytes)}"
        if self.skipped:
            text += " (skipped: " + ", ".join(f"{n} {why}" for why, n in self.skipped.items())
            named = [*self.loops, *self.skipped_links]
            if named:
                text += f": {first_few(named)}"
            text += ")"
        return text


_NAMED = 5  # skipped links named in a summary


def first_few(named: Sequence[str]) -> str:
    """A summary's list of paths: the first few, then "..." if there are more; a path
    with a newline or another control character quoted, so it cannot break the line."""
    shown = [name if name.isprintable() else repr(name) for name in named[:_NAMED]]
    return ", ".join(shown) + (", ..." if len(named) > _NAMED else "")


# File names that hold credentials by convention, whatever their content.
_SECRET_NAMES = frozenset(
    {
        "id_rsa",
        "id_dsa",
        "id_ecdsa",
        "id_ed25519",
        "id_ecdsa_sk",
        "id_ed25519_sk",
        ".netrc",
        "_netrc",
        ".pypirc",
        ".npmrc",
        ".git-credentials",
        ".env",
        ".envrc",  # direnv: exports, often tokens
        ".pgpass",
        ".my.cnf",
        ".boto",
        ".s3cfg",
        ".dockercfg",
        ".vault-token",
        ".htpasswd",
        "credentials",  # ~/.aws/credentials
        "credentials.json",
        "application_default_credentials.json",
        "client_secret.json",
    }
)
_SECRET_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".jks", ".keystore", ".ppk")
_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_CREDENTIAL_TYPES = ("service_account", "authorized_user", "external_account")
_SNIFF = 64 * 1024  # bytes of each file read for a private key header
_JSON_SNIFF = 4 * 2**20  # JSON files up to this size are parsed for credentials


def _secret_name(name: str) -> str | None:
    """Why a file called `name` looks like a secret whatever it holds, or None."""
    lower = name.lower()
    if lower in _SECRET_NAMES or lower.startswith(".env."):
        return "a credentials file by name"
    if lower.endswith(_SECRET_SUFFIXES):
        return f"a key file by name (*{Path(lower).suffix})"
    if lower.startswith(("service-account", "service_account")) and lower.endswith(".json"):
        return "a service-account file by name"
    return None


def _secret_reason(path: Path, name: str) -> str | None:
    """Why the file at `path` looks like a secret (by `name`, then by content), or None."""
    by_name = _secret_name(name)
    if by_name is not None:
        return by_name
    lower = name.lower()
    try:
        with path.open("rb") as handle:
            head = handle.read(_SNIFF)
    except OSError as exc:
        raise WorkspaceError(f"Cannot read {path}: {exc.strerror}") from exc
    if _PRIVATE_KEY.search(head):
        return "contains a private key (-----BEGIN ... PRIVATE KEY-----)"
    if lower.endswith(".json") and (b'"private_key' in head or b'"type"' in head):
        size = path.stat().st_size
        if size <= _JSON_SNIFF:
            try:
                data = json.loads(path.read_bytes())
            except (ValueError, UnicodeDecodeError):
                return None
            if isinstance(data, dict) and (
                "private_key" in data or data.get("type") in _CREDENTIAL_TYPES
            ):
                return "a credentials JSON (private_key / service_account / authorized_user)"
    return None


def _rules_of(directory: Path, base: str) -> list[IgnoreRule]:
    """The rules of the ignore files in `directory` (.gitignore, then .tpulabignore)."""
    rules: list[IgnoreRule] = []
    for name in (".gitignore", IGNORE_FILE):
        file = directory / name
        if file.is_file() and not file.is_symlink():
            try:
                text = file.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                raise WorkspaceError(f"Cannot read {file}: {exc.strerror}") from exc
            rules.extend(parse_ignore_lines(text.splitlines(), base))
    return rules


def _link_target(link: Path) -> Path | None:
    """Where `link` leads (maybe nowhere: a dangling link), or None when it loops."""
    try:
        target = link.resolve()
    except RuntimeError:  # Python 3.11's resolve(): "Symlink loop from ..."
        return None
    try:
        os.stat(target)
    except OSError as error:  # 3.13+ resolves a loop to itself, and stat() says ELOOP
        if error.errno == errno.ELOOP:
            return None
    return target


def _normalised_relative(path: str, option: str) -> str:
    """The config layer's one rule for workspace paths, raised as a WorkspaceError."""
    if "\0" in path:
        raise WorkspaceError(f"{option} {path!r} contains a NUL byte")
    try:
        return check_workspace_pattern(path, option)
    except WorkspaceError:
        raise
    except ConfigError as error:
        raise WorkspaceError(error.message, hint=error.hint) from error


def _is_virtualenv(directory: Path) -> bool:
    return (directory / "pyvenv.cfg").is_file()


def _is_run_output(directory: Path) -> bool:
    """An earlier run's --out (tpulab's run.json in it), wherever it is: one inside the
    workdir (`--out results/r1`) would otherwise go up with the next run, checkpoints
    and all. A user's own run.json is not one unless it is tpulab's record."""
    record = directory / "run.json"
    if not record.is_file():
        return False
    try:
        with record.open("rb") as handle:
            head = json.loads(handle.read(_RECORD_MAX))
    except (OSError, ValueError):
        return False
    return isinstance(head, dict) and {"schema_version", "run_id", "command"} <= head.keys()


_RECORD_MAX = 4 * 2**20  # a run.json is a few KiB; past this it is not tpulab's


class _Verdicts:
    """What the exclusions say about any path of the workspace: the walk asks about each
    entry it meets, and a symlink about its target, which may live anywhere in the tree
    (so the rules in force in each directory are built once, on first use)."""

    def __init__(self, root: Path, exclude: Sequence[str]) -> None:
        self.root = root
        self.always = IgnoreRules(parse_ignore_lines(ALWAYS_EXCLUDED))
        self.user = IgnoreRules(parse_ignore_lines(exclude))
        self._rules: dict[str, IgnoreRules] = {}

    def rules_in(self, directory: str) -> IgnoreRules:
        """The ignore files' rules in force for the entries of `directory` ("" = root)."""
        rules = self._rules.get(directory)
        if rules is None:
            above = self.rules_in(posixpath.dirname(directory)) if directory else IgnoreRules()
            rules = above.extended(_rules_of(self.root / directory, directory))
            self._rules[directory] = rules
        return rules

    def of_entry(self, path: str, *, is_dir: bool) -> str | None:
        """ "always excluded", "ignored" or None for `path`, its directory being walked."""
        if self.always.ignored(path, is_dir=is_dir) or (
            is_dir and (_is_virtualenv(self.root / path) or _is_run_output(self.root / path))
        ):
            return "always excluded"
        if self.user.ignored(path, is_dir=is_dir) or self.rules_in(posixpath.dirname(path)).ignored(
            path, is_dir=is_dir
        ):
            return "ignored"
        return None

    def of_file(self, path: str) -> str | None:
        """The verdict on the file `path` wherever it is: that of the first directory on
        its way that the walk would not enter, else its own."""
        parts = path.split("/")
        for depth in range(1, len(parts)):
            verdict = self.of_entry("/".join(parts[:depth]), is_dir=True)
            if verdict is not None:
                return verdict
        return self.of_entry(path, is_dir=False)


def select_workspace(
    root: Path,
    *,
    max_bytes: int = DEFAULT_MAX_UPLOAD,
    allow_secrets: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> UploadSelection:
    """The files of `root` that go up; validation only (reads the tree, never the
    network). WorkspaceError for a missing root, an upload over `max_bytes`, or a
    secret-looking file that `allow_secrets` does not name.

    Symlinks: a link to a file inside the workspace goes up as that file's content, and
    is judged as that file too: a link to an excluded or ignored file is skipped (the
    summary names both), and a link to a secret-looking one is refused like it (the
    refusal names both). A link leading outside the workspace, and any link to a
    directory, is skipped (counted in `skipped`). Refusing those would block runs over
    harmless links (editor state, a `result` link to a build store); following them
    would send files the user never put in the workspace, or loop. A link that loops
    (a -> b -> a) is skipped like a dangling one, under its own reason, and named in
    `loops` (docs/guides/experiment.md).
    """
    if not root.exists():
        raise WorkspaceError(
            f"Workspace {root} does not exist",
            hint="Pass an existing directory with --workdir (default: the current one).",
        )
    if not root.is_dir():
        raise WorkspaceError(f"Workspace {root} is not a directory", hint="Pass --workdir DIR.")
    root = root.resolve()
    allowed = {_normalised_relative(path, "--allow-secret") for path in allow_secrets}
    verdicts = _Verdicts(root, exclude)
    files: list[tuple[str, int]] = []
    skipped: dict[str, int] = {}
    skipped_links: list[str] = []
    # Each selected file as shown, its path here, and why it looks like a secret by its
    # name (None: its content is sniffed, once the upload is known to be under the cap).
    judged: list[tuple[str, str, Path, str | None]] = []
    loops: list[str] = []

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    def walk(directory: Path, rel: str) -> None:
        try:
            children = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError as exc:
            raise WorkspaceError(f"Cannot list {directory}: {exc.strerror}") from exc
        for child in children:
            path = f"{rel}/{child.name}" if rel else child.name
            is_dir = child.is_dir(follow_symlinks=False)
            verdict = verdicts.of_entry(path, is_dir=is_dir)
            if verdict is not None:
                skip(verdict)
                continue
            if is_dir:
                walk(Path(child.path), path)
                continue
            full = Path(child.path)
            shown, reason = path, None
            if child.is_symlink():
                target = _link_target(full)
                if target is None:
                    loops.append(path)
                    skip("symlink loops")
                    continue
                if not target.is_file() or not target.is_relative_to(root):
                    skip("symlinks leaving the workspace or to directories")
                    continue
                # Judged as what it sends: its target's content under its target's name.
                linked = target.relative_to(root).as_posix()
                verdict = verdicts.of_file(linked)
                if verdict is not None:
                    skip(f"links to {verdict} files")
                    skipped_links.append(f"{path} -> {linked} ({verdict})")
                    continue
                shown = f"{path} (a link to {linked})"
                reason = _secret_name(target.name)
            elif not child.is_file(follow_symlinks=False):
                skip("not regular files")
                continue
            judged.append((path, shown, full, reason))
            files.append((path, full.stat().st_size))

    walk(root, "")
    chosen = {path for path, _size in files}
    unknown = sorted(allowed - chosen)
    if unknown:
        raise WorkspaceError(
            f"--allow-secret names {', '.join(map(repr, unknown))}, which is not in the "
            f"upload from {root}",
            hint="Name the file by its path relative to the workspace, as the refusal listed it.",
        )
    total = sum(size for _path, size in files)
    selection = UploadSelection(
        root, tuple(files), total, skipped, tuple(loops), tuple(skipped_links)
    )
    if total > max_bytes:
        # Before any file's content is read: a workspace that cannot go up anyway (a
        # home directory, say) is refused on its sizes, not after sniffing every file.
        listing = "\n".join(
            f"  {human_size(size):>10}  {path}" for path, size in selection.largest()
        )
        raise WorkspaceError(
            f"The workspace upload is {selection.describe()}: "
            f"{over_cap(total, max_bytes)}; the largest entries:\n{listing}",
            hint=f"Exclude what the VM does not need in {IGNORE_FILE} (gitignore syntax), "
            "or raise the cap with --max-upload.",
        )
    secrets = [
        (shown, reason)
        for path, shown, full, by_name in judged
        if path not in allowed and (reason := by_name or _secret_reason(full, full.name))
    ]
    if secrets:
        listing = "\n".join(f"  {path}: {reason}" for path, reason in secrets[:20])
        more = f"\n  ... and {len(secrets) - 20} more" if len(secrets) > 20 else ""
        raise WorkspaceError(
            f"The workspace {root} holds {len(secrets)} file(s) that look like secrets; "
            f"nothing was sent:\n{listing}{more}",
            hint="Add them to .tpulabignore (or .gitignore) to keep them here, or pass "
            "--allow-secret PATH for each one the VM really needs.",
        )
    return selection


def check_fetch_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    """`--fetch` patterns, normalised; WorkspaceError for empty, absolute or `..`."""
    return tuple(_normalised_relative(pattern, "--fetch") for pattern in patterns)
