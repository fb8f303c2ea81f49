"""`--requirements FILE` read as pip reads it, so the VM resolves it as the laptop does.

pip (req_file.py; uv matches it since astral-sh/uv#1421) resolves a file's references
two ways:

- nested `-r FILE` / `-c FILE`: relative to the file that names them;
- every other local path (`-e .`, `-e ./pkg`, `./wheels/x.whl`, `file:./pkg`,
  `name @ ./pkg`, `-f ./wheels`): relative to the directory pip runs in.

What tpulab does with that, decided here before anything is created:

- FILE inside the workspace (--workdir): the VM installs from the synced copy, with pip
  run in the synced workspace's root. Nested files resolve against their synced copies
  and other paths against the workspace root: exactly `pip install -r FILE` run from
  --workdir on the laptop. (pip on the laptop resolves `-e .` against the shell's
  directory; the workspace root is the only directory the VM has of the laptop's, so
  paths are written relative to it. When the user runs tpulab from elsewhere and a path
  only exists relative to that other directory, the refusal says so.) Every nested file
  and local path must be inside the workspace and exist; the run's validation then checks
  that each is in the upload (not ignored): `RequirementsFile.uploads`.
- FILE outside the workspace: only its text is staged on the VM, so it may name packages
  by name or URL only; a local reference is refused, naming the file, the line and the
  reference, and what to do instead.

Absolute local paths are refused either way: they name the laptop's disk, not the VM's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import unquote, urlsplit

from tpulab.config.local_paths import resolve_local
from tpulab.errors import ConfigError

__all__ = [
    "LocalPath",
    "Reference",
    "RequirementsFile",
    "distribution_names",
    "logical_lines",
    "read_requirements",
    "references",
]

Kind = Literal["requirements", "constraints", "editable", "path", "find-links", "name"]

# Options whose value is a file, a path or a URL; the others (--hash, --pre, ...) name nothing.
_VALUE_OPTIONS: dict[str, Kind] = {
    "-r": "requirements",
    "--requirement": "requirements",
    "-c": "constraints",
    "--constraint": "constraints",
    "-e": "editable",
    "--editable": "editable",
    "-f": "find-links",
    "--find-links": "find-links",
    "-i": "find-links",  # an index is a location too: a local one must travel like a wheel
    "--index-url": "find-links",
    "--extra-index-url": "find-links",
}
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_DIRECT = re.compile(rf"^({_NAME})\s*(?:\[[^\]]*\])?\s*@\s*(.+)$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_ARCHIVES = (".whl", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar", ".zip")
_COMMENT = re.compile(r"(^|\s+)#.*$")
_WHAT: dict[Kind, str] = {
    "requirements": "requirements file (-r)",
    "constraints": "constraints file (-c)",
    "editable": "editable project (-e)",
    "path": "local package path",
    "find-links": "local package location",
    "name": "package",
}


@dataclass(frozen=True)
class Reference:
    """One thing a requirements line names: a file (-r/-c), a local path, or a package."""

    line: int  # the first physical line of the logical line (pip's numbering)
    kind: Kind
    value: str  # as written (for "name": the distribution name)
    local: str | None = None  # the local path it refers to, None for a URL or a name
    name: str | None = None  # the distribution, when the line names it (lower case)


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """pip's preprocessing: join `\\` continuations, then drop comments and blank lines."""
    joined: list[str] = []
    first = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.endswith("\\") or _COMMENT.match(line):
            if _COMMENT.match(line):
                line = " " + line  # so that the comment is stripped below
            if joined:
                joined.append(line)
                number, line = first, "".join(joined)
                joined = []
            stripped = _COMMENT.sub("", line).strip()
            if stripped:
                yield number, stripped
        else:
            if not joined:
                first = number
            joined.append(line.rstrip("\\"))
    if joined:
        stripped = _COMMENT.sub("", "".join(joined)).strip()
        if stripped:
            yield first, stripped


def references(text: str, source: str = "the requirements file") -> Iterator[Reference]:
    """Every file, path, URL and package a requirements text names, line by line."""
    for number, line in logical_lines(text):
        # pip's break_args_options: the requirement is the words before the first option.
        words = line.split()
        cut = next((i for i, word in enumerate(words) if word.startswith("-")), len(words))
        if cut:
            yield _requirement(number, " ".join(words[:cut]))
        try:
            tokens = shlex.split(" ".join(words[cut:]))
        except ValueError as error:
            raise ConfigError(
                f"{source}, line {number}: cannot parse {line!r} ({error}).",
                hint="Fix the quoting on that line; pip would refuse it too.",
            ) from None
        yield from _options(number, tokens, f"{source}, line {number}")


def _options(number: int, tokens: list[str], where: str) -> Iterator[Reference]:
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        option, equals, value = token.partition("=")
        if option.startswith("--") and option in _VALUE_OPTIONS:
            kind = _VALUE_OPTIONS[option]
            if not equals:
                value = tokens[index] if index < len(tokens) else ""
                index += 1
        elif len(token) >= 2 and token[:2] in _VALUE_OPTIONS:
            kind = _VALUE_OPTIONS[token[:2]]
            value = token[2:]
            if not value:
                value = tokens[index] if index < len(tokens) else ""
                index += 1
        else:
            continue
        named = option if option.startswith("--") else token[:2]
        if not value.strip():
            raise ConfigError(
                f"{where}: {named} has no value.",
                hint=f"Give {named} its file, path or URL on the same line; pip would "
                "refuse the line too.",
            )
        path = _bare(value) if kind == "editable" else value
        shown = f"{named} {value}"
        yield Reference(number, kind, shown, _local_of(path, always_path=True))


def _requirement(number: int, text: str) -> Reference:
    """A requirement line: a name (with extras, versions, markers), `name @ URL`, a URL,
    or a path (pip takes anything that looks like a path or an archive as one)."""
    spec = text.split(";", 1)[0].strip()
    direct = _DIRECT.match(spec)
    if direct:
        local = _local_of(direct.group(2).strip(), always_path=True)
        return Reference(number, "path", text, local, name=direct.group(1).lower())
    looks_local = (
        spec.startswith((".", "/", "~", "\\"))
        or "/" in spec
        or "\\" in spec
        or spec.lower().endswith(_ARCHIVES)
    )
    if _SCHEME.match(spec) and not _DRIVE.match(spec):
        return Reference(number, "path", text, _local_of(_bare(spec), always_path=False))
    if looks_local:
        return Reference(number, "path", text, _bare(spec))
    name = re.match(_NAME, spec)
    return Reference(number, "name", text, name=name.group(0).lower() if name else None)


def _bare(value: str) -> str:
    """A path without pip's decorations: `#egg=...` fragments and trailing `[extras]`."""
    value = value.split("#", 1)[0].strip()
    return re.sub(r"\[[^\]]*\]$", "", value)


def _local_of(value: str, always_path: bool) -> str | None:
    """The local path a value names, or None for a remote URL. `file:` URLs are local
    (`file:./pkg` is relative, `file:///x` absolute); a value with another scheme is
    remote; a bare value is a path when `always_path` (an option's value)."""
    if _DRIVE.match(value):
        return value
    if _SCHEME.match(value):
        parts = urlsplit(value)
        if parts.scheme.lower() != "file":
            return None
        path = unquote(parts.path)
        if parts.netloc and parts.netloc.lower() != "localhost":
            return f"//{parts.netloc}{path}"  # a network share: absolute, and not the VM's
        return path or "."
    return value if always_path else None


def distribution_names(texts: Sequence[str]) -> list[str]:
    """The distributions the texts name (for the probe of resolved versions); a bare
    path or URL names none that is known before the install."""
    names = [ref.name for text in texts for ref in references(text) if ref.name]
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class LocalPath:
    """Something in the workspace that pip on the VM reads: it must go up with the sync."""

    path: str  # posix, relative to the workspace root
    source: str  # "requirements.txt, line 3 (-e ./pkg)": for the refusal
    project_file: str | None = None  # for a project directory: its pyproject.toml/setup.py


@dataclass(frozen=True)
class RequirementsFile:
    """A validated --requirements FILE and what pip will read through it."""

    path: Path  # absolute
    text: str
    # Posix path relative to the workspace root when FILE is inside the workspace: the VM
    # installs from the synced copy, pip running in the workspace root. None: staged alone.
    workspace_path: str | None = None
    nested: tuple[tuple[str, str], ...] = ()  # (workspace path, text) of -r/-c files
    uploads: tuple[LocalPath, ...] = ()  # what the sync must carry (FILE and nested too)

    @property
    def texts(self) -> tuple[str, ...]:
        return (self.text, *(text for _path, text in self.nested))

    @property
    def names(self) -> list[str]:
        return distribution_names(self.texts)


def read_requirements(path: Path, *, workdir: Path, cwd: Path) -> RequirementsFile:
    """Read and check FILE (absolute) for a run whose workspace is `workdir` (absolute,
    resolved). ConfigError naming file, line and reference for anything the VM could
    not resolve as the laptop does."""
    text = _read(path, "--requirements")
    if not path.is_relative_to(workdir):
        for ref in references(text, str(path)):
            if ref.local is not None:
                raise ConfigError(
                    f"{path}, line {ref.line}: {ref.value!r} names a local "
                    f"{_WHAT[ref.kind].removeprefix('local ')}, "
                    f"but {path.name} is outside the workspace "
                    f"({workdir}): only its text goes to the VM, where that path does not "
                    "exist.",
                    hint=f"Move {path.name} (and what it refers to) into the workspace, "
                    "where the VM resolves its paths as pip does on the laptop; or name "
                    "the package instead (--with NAME, or a URL in the file).",
                )
        return RequirementsFile(path, text)
    checker = _WorkspaceCheck(workdir, cwd)
    checker.visit(path, text)
    return RequirementsFile(
        path,
        text,
        workspace_path=checker.relative(path),
        nested=tuple(checker.nested),
        uploads=tuple(checker.uploads),
    )


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"Cannot read {what} {path}: {error}",
            hint="Pass a readable UTF-8 requirements file.",
        ) from None


class _WorkspaceCheck:
    """Walks FILE and its nested -r/-c files inside the workspace, as pip would."""

    def __init__(self, workdir: Path, cwd: Path) -> None:
        self.workdir = workdir
        self.cwd = cwd.resolve()
        self.seen: set[Path] = set()
        self.via: dict[Path, str] = {}  # a nested file -> the line that named it
        self.nested: list[tuple[str, str]] = []
        self.uploads: list[LocalPath] = []

    def relative(self, path: Path) -> str:
        return path.relative_to(self.workdir).as_posix()

    def visit(self, path: Path, text: str) -> None:
        self.seen.add(path)
        self.uploads.append(LocalPath(self.relative(path), f"--requirements {path}"))
        for ref in references(text, str(path)):
            if ref.local is None:
                continue
            where = f"{self.relative(path)}, line {ref.line} ({ref.value})"
            if PurePosixPath(ref.local).is_absolute() or ref.local.startswith(("~", "\\")):
                raise self._refuse(path, ref, "is an absolute path: it names the laptop's disk")
            if _DRIVE.match(ref.local):
                raise self._refuse(path, ref, "is an absolute path: it names the laptop's disk")
            if ref.kind in ("requirements", "constraints"):
                self._nested(path, ref, where)
            elif ref.kind == "find-links":
                self._location(path, ref, where)
            else:
                self._package(path, ref, where)

    def _nested(self, path: Path, ref: Reference, where: str) -> None:
        assert ref.local is not None
        target = self._resolved(path, ref, path.parent / ref.local)
        self._inside(path, ref, target, base=f"the directory of {path.name}")
        if not target.is_file():
            raise self._refuse(
                path, ref, f"is not a file ({target}; pip reads it relative to {path.name})"
            )
        if target in self.seen:
            return  # pip would loop; reading it once is enough to check it
        nested = _read(target, f"{where}:")
        self.via[target] = f"{self.relative(path)}, line {ref.line}"
        self.nested.append((self.relative(target), nested))
        self.visit(target, nested)

    def _location(self, path: Path, ref: Reference, where: str) -> None:
        assert ref.local is not None
        # pip tries the requirements file's directory first, then the directory it runs in.
        beside = self._resolved(path, ref, path.parent / ref.local)
        target = beside if beside.exists() else self._resolved(path, ref, self.workdir / ref.local)
        self._inside(path, ref, target, base="the workspace root")
        if not target.exists():
            raise self._refuse(path, ref, self._missing(ref, target))
        self.uploads.append(LocalPath(self.relative(target), where))

    def _package(self, path: Path, ref: Reference, where: str) -> None:
        assert ref.local is not None
        target = self._resolved(path, ref, self.workdir / ref.local)
        self._inside(path, ref, target, base="the workspace root")
        if target.is_dir():
            project = next(
                (name for name in ("pyproject.toml", "setup.py") if (target / name).is_file()),
                None,
            )
            if project is None:
                raise self._refuse(
                    path,
                    ref,
                    f"is a directory ({target}) without pyproject.toml or setup.py, so pip "
                    "cannot install it",
                )
            self.uploads.append(LocalPath(self.relative(target), where, project))
        elif target.is_file():
            self.uploads.append(LocalPath(self.relative(target), where))
        else:
            raise self._refuse(path, ref, self._missing(ref, target))

    def _resolved(self, path: Path, ref: Reference, target: Path) -> Path:
        """`target` resolved; a link loop or an unusable name is refused, naming the line."""
        return resolve_local(
            target,
            f"{path}, line {ref.line}: {ref.value!r} ->",
            hint="Fix the path or the link it goes through, or remove the line.",
        )

    def _missing(self, ref: Reference, target: Path) -> str:
        said = f"does not exist ({target}; pip on the VM runs in the workspace root)"
        assert ref.local is not None
        if self.cwd != self.workdir and (self.cwd / ref.local).exists():
            said += (
                f"; it exists relative to your current directory {self.cwd}, which is not "
                "the workspace: write it relative to the workspace root"
            )
        return said

    def _inside(self, path: Path, ref: Reference, target: Path, base: str) -> None:
        if not target.is_relative_to(self.workdir):
            raise self._refuse(
                path,
                ref,
                f"leaves the workspace ({target}, resolved against {base}); only the "
                "workspace goes to the VM",
            )

    def _refuse(self, path: Path, ref: Reference, why: str) -> ConfigError:
        chain, at = [], path
        while at in self.via:
            chain.append(self.via[at])
            at = self.workdir / self.via[at].rsplit(", line ", 1)[0]
        through = f" ({path.name} is read through {' <- '.join(chain)})" if chain else ""
        return ConfigError(
            f"{path}, line {ref.line}: {ref.value!r} ({_WHAT[ref.kind]}) {why}{through}.",
            hint=f"Everything {path.name} refers to must be inside the workspace "
            f"({self.workdir}), written relative to it (nested -r/-c files relative to the "
            "file naming them), as for `pip install -r` run there; or name the package "
            "instead (--with NAME, or a URL).",
        )
