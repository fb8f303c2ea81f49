"""The user's experiment (`tpulab run ... -- CMD`): its flags validated into a WorkloadSpec.

Everything a workload needs is checked here, before anything is created (docs/architecture.md §3,
invariant 1): the command argv, the workspace directory, where artifacts land, the extra
environment, the packages, the fetch patterns, the size caps and the timeout. Values come
from the flags first, then from the workspace's project file ([tool.tpulab] in
pyproject.toml, or tpulab.toml: config/project_file.py), then from defaults; every field
remembers which (`WorkloadSpec.sources`) so `--dry-run` can say where it came from.

What is NOT checked here, because it needs the workspace's content: the upload's size and
secret-looking files (tpulab.remote.workspace.select_workspace, run by the lifecycle's
validation phase before the create). The caps' defaults live here, not there, because
config sits below remote in the layers (pyproject [tool.importlinter]).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from tpulab.config.local_paths import check_utf8, prove_creatable, resolve_local
from tpulab.config.requirements import RequirementsFile, read_requirements
from tpulab.config.resolve import check_seconds
from tpulab.errors import ConfigError

if TYPE_CHECKING:
    from tpulab.config.project_file import ProjectDefaults

__all__ = [
    "DEFAULT_COMMAND_TIMEOUT",
    "DEFAULT_MAX_FETCH",
    "DEFAULT_MAX_UPLOAD",
    "RESERVED_ENV",
    "RUNS_DIR",
    "WorkloadFlags",
    "WorkloadSpec",
    "build_workload",
    "check_env",
    "check_exclude_pattern",
    "check_requirement",
    "check_workspace_pattern",
    "parse_size",
]

DEFAULT_MAX_UPLOAD = 256 * 2**20
DEFAULT_MAX_FETCH = 2**30
# The user's command's own limit (`--timeout`); the verifier's is `--payload-timeout`.
DEFAULT_COMMAND_TIMEOUT = 3600.0
# Where artifacts land by default: ./tpulab-runs/<run id>/ (the upload always skips it).
RUNS_DIR = "tpulab-runs"
# Names tpulab sets for the command: a user value would silently lose (or, worse, win
# against the platform the verifier proved). TPULAB_* is tpulab's namespace as a whole.
RESERVED_ENV = ("JAX_PLATFORMS", "COURSE_EXPECT_PLATFORM", "VIRTUAL_ENV", "PATH", "HOME")
RESERVED_ENV_PREFIX = "TPULAB_"
# The largest cap a size flag accepts: a typo like 1000G should not pass as intended.
_MAX_SIZE = 2**40


@dataclass(frozen=True)
class WorkloadSpec:
    """The validated `-- CMD` part of a run. Built by `build_workload`; never from raw flags."""

    command: tuple[str, ...]  # argv after `--`, never joined into a shell string
    workdir: Path  # absolute, an existing directory
    out: Path  # absolute; default ./tpulab-runs/<run id>/
    env: tuple[tuple[str, str], ...]  # --env K=V and [tool.tpulab] env, names checked
    with_packages: tuple[str, ...]  # --with requirements (PEP 508 name, extras, versions)
    requirements: RequirementsFile | None  # --requirements FILE, read, references checked
    fetch: tuple[str, ...]  # --fetch patterns, workspace-relative
    # [tool.tpulab] exclude, then --exclude (gitignore syntax), then --out if inside
    exclude: tuple[str, ...]
    allow_secrets: tuple[str, ...]  # --allow-secret PATH, workspace-relative
    max_upload: int = DEFAULT_MAX_UPLOAD  # bytes
    max_fetch: int = DEFAULT_MAX_FETCH  # bytes
    timeout: float = DEFAULT_COMMAND_TIMEOUT  # seconds the command may run
    quiet: bool = False  # only log the command's output, do not stream it
    all_output: bool = False  # a slice: stream every worker's output, not worker 0's alone
    # field name -> where its value came from: "--with", "pyproject.toml [tool.tpulab]",
    # "default", ... (the same words Resolved.source uses for project and zone).
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def env_names(self) -> tuple[str, ...]:
        """The names only: what run.json records (values may be secret)."""
        return tuple(name for name, _ in self.env)


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(option: str, text: str | int) -> int:
    """Bytes from `1000`, `256M`, `1.5G`, `64KiB` (K/M/G/T are powers of 1024)."""
    match = _SIZE.match(str(text))
    number = float(match.group(1)) if match else math.nan
    unit = match.group(2).upper() if match else ""
    scale = 1024 ** ("KMGT".find(unit) + 1) if unit else 1
    size = number * scale
    if not (math.isfinite(size) and 1 <= size <= _MAX_SIZE):
        raise ConfigError(
            f"Invalid {option} {str(text)!r}.",
            hint="Give a size in bytes, or with a unit: 1000, 512K, 256M, 1G (powers of "
            "1024), between 1 byte and 1T.",
        )
    return int(size)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env(item: str, source: str = "--env") -> tuple[str, str]:
    """`K=V` -> (K, V): K a valid variable name that tpulab does not set itself."""
    name, equals, value = item.partition("=")
    if not equals or not _ENV_NAME.match(name):
        raise ConfigError(
            f"Malformed {source} {item!r}.",
            hint="Give NAME=VALUE, NAME made of letters, digits and _ (not starting with a "
            "digit), e.g. --env WANDB_MODE=offline.",
        )
    check_env_value(name, value, source)
    return name, value


def check_env_value(name: str, value: str, source: str) -> None:
    if name in RESERVED_ENV or name.upper().startswith(RESERVED_ENV_PREFIX):
        raise ConfigError(
            f"{source} {name} is set by tpulab itself.",
            hint="tpulab sets JAX_PLATFORMS and COURSE_EXPECT_PLATFORM to the verified "
            "platform, TPULAB_RUN_ID/TPULAB_RUN_DIR, and the venv's PATH/VIRTUAL_ENV/HOME; "
            "pick another name.",
        )
    if "\0" in value:
        raise ConfigError(f"{source} {name} has a NUL character.", hint="Remove it.")


# PEP 508 without URLs or markers: a name, optional [extras], optional version specifiers.
# `packaging` is no dependency of tpulab, and this strict form is also what keeps a
# `--with` from ever reading as an installer option (`--index-url=...`, `-e .`).
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_SPEC = r"(?:~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+"
_REQUIREMENT = re.compile(
    rf"^{_NAME}(?:\s*\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?"
    rf"(?:\s*\(?\s*{_SPEC}(?:\s*,\s*{_SPEC})*\s*\)?)?$"
)


def check_requirement(text: str, source: str = "--with") -> str:
    """A requirement such as `flax`, `optax>=0.2`, `orbax-checkpoint[all]==0.6.4`."""
    value = text.strip()
    if not _REQUIREMENT.match(value):
        raise ConfigError(
            f"Invalid {source} {text!r}.",
            hint="Give a package requirement: NAME, NAME[extra], NAME==1.2 or NAME>=1,<2 "
            "(no URLs, markers or installer options; put those in --requirements FILE).",
        )
    return value


def check_workspace_pattern(text: str, option: str) -> str:
    """A path or glob inside the workspace: relative, no `..`, normalised to posix."""
    value = text.strip().replace("\\", "/")
    parts = PurePosixPath(value).parts
    if not value or value.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", value):
        raise ConfigError(
            f"{option} {text!r} is not inside the workspace.",
            hint=f"{option} takes a path relative to the workspace (--workdir), e.g. "
            f"{option} checkpoints/ or {option} 'logs/*.json'.",
        )
    if ".." in parts:
        raise ConfigError(
            f"{option} {text!r} leaves the workspace (..).",
            hint=f"{option} takes a path relative to the workspace, without '..'.",
        )
    normal = str(PurePosixPath(*[part for part in parts if part != "."]))
    return normal + "/" if value.endswith("/") and normal != "." else normal


def check_exclude_pattern(text: str, source: str = "--exclude") -> str:
    """A gitignore pattern (tpulab.remote.ignore) for the upload, from the workspace's
    file or --exclude: refused when it could only ever match nothing, which would upload
    what the user meant to keep back (a comment, a trailing backslash, `..`, `~`)."""
    value = text.strip()
    example = (
        f"e.g. {source} 'data/*.bin' or {source} checkpoints/"
        if source.startswith("--")
        else 'e.g. exclude = ["data/*.bin", "checkpoints/"]'
    )
    if not value or any(char in value for char in "\0\n\r"):
        raise ConfigError(
            f"{source} {text!r} is not a pattern.",
            hint=f"Give one gitignore pattern, relative to the workspace, {example}.",
        )
    if value.startswith("#"):
        raise ConfigError(
            f"{source} {text!r} is a comment in gitignore syntax: it excludes nothing.",
            hint=f"Escape a name that starts with # with a backslash: '\\{value}'.",
        )
    if value.endswith("\\") and not value.endswith("\\\\"):
        raise ConfigError(
            f"{source} {text!r} ends with a backslash, which git treats as matching nothing.",
            hint=f"Remove the trailing backslash, {example}.",
        )
    body = value.removeprefix("!").strip("/")
    parts = PurePosixPath(body).parts
    if not body or body.startswith("~") or ".." in parts:
        raise ConfigError(
            f"{source} {text!r} names nothing inside the workspace.",
            hint="Patterns match paths relative to the workspace (--workdir); no '..' or '~' "
            f"(a leading / anchors one at the workspace root), {example}.",
        )
    return value


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class WorkloadFlags:
    """The workload flags exactly as typer parsed them; None / empty means "not given"."""

    command: Sequence[str] = ()
    workdir: str | None = None
    out: str | None = None
    env: Sequence[str] = ()
    with_packages: Sequence[str] = ()
    requirements: str | None = None
    fetch: Sequence[str] = ()
    exclude: Sequence[str] = ()
    allow_secrets: Sequence[str] = ()
    max_upload: str | None = None
    max_fetch: str | None = None
    timeout: float | None = None
    quiet: bool = False
    all_output: bool = False

    def refuse_without_command(self) -> None:
        """A workload flag without `-- CMD` is a mistake (a forgotten `--`), not a no-op."""
        given = [] if self.command else self.given()
        if given:
            raise ConfigError(
                f"{given[0]} needs a command after --.",
                hint="Name the command to run on the TPU VM, e.g. `tpulab run --accelerator "
                "v5litepod-4 --fetch ckpt/ -- python train.py` (the verifier's own limit is "
                "--payload-timeout).",
            )

    def given(self) -> list[str]:
        """The workload options that were set, by name. Not --workdir: it also says whose
        [tool.tpulab] defaults a verify-only run takes."""
        named = {
            "--out": self.out is not None,
            "--env": bool(self.env),
            "--with": bool(self.with_packages),
            "--requirements": self.requirements is not None,
            "--fetch": bool(self.fetch),
            "--exclude": bool(self.exclude),
            "--allow-secret": bool(self.allow_secrets),
            "--max-upload": self.max_upload is not None,
            "--max-fetch": self.max_fetch is not None,
            "--timeout": self.timeout is not None,
            "--quiet": self.quiet,
            "--all-output": self.all_output,
        }
        return [option for option, present in named.items() if present]


def check_workdir(flag: str | None, cwd: Path) -> Path:
    """The workspace root: --workdir (relative to `cwd`) or `cwd`, an existing directory."""
    if flag is not None and not flag.strip():
        raise ConfigError("--workdir is empty.", hint="Pass a directory, or leave it out.")
    hint = "Pass --workdir DIR, an existing directory (default: the current one)."
    given = cwd / Path(flag).expanduser() if flag is not None else cwd
    path = resolve_local(given, "--workdir", hint=hint)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise ConfigError(
            f"Workdir {path} {what}.",
            hint=hint,
        )
    return path


def build_workload(
    flags: WorkloadFlags, *, run_id: str, workdir: Path, cwd: Path, defaults: ProjectDefaults
) -> WorkloadSpec | None:
    """The validated workload, or None when there is no `-- CMD` (a verify-only run).

    Flags win over the workspace's file, which wins over defaults: a flag replaces the
    file's value (lists included, so `--with x` is exactly x), except `env`, whose names
    merge, a flag's value winning for a name both set, and `exclude`, whose flags come
    after the file's patterns (later gitignore rules win, so `--exclude '!x'` can also
    bring back what the file excludes).
    """
    flags.refuse_without_command()
    command = tuple(flags.command)
    if not command:
        return None
    if not command[0].strip() or any("\0" in arg for arg in command):
        raise ConfigError(
            f"Invalid command {list(command)!r}.",
            hint="Give the program and its arguments after --, e.g. -- python train.py.",
        )
    sources: dict[str, str] = {
        "command": "--",
        "workdir": "--workdir" if flags.workdir else "default",
    }

    def pick(name: str, option: str, flag: tuple[str, ...], key: str) -> tuple[str, ...]:
        # A flag replaces the file's list: `--with x` means exactly x.
        if flag:
            sources[name] = option
            return flag
        sources[name] = defaults.source if key in defaults.keys else "default"
        return tuple(getattr(defaults, name))

    with_packages = pick(
        "with_packages", "--with", _unique([check_requirement(p) for p in flags.with_packages]),
        "with",
    )  # fmt: skip
    fetch = pick(
        "fetch", "--fetch", _unique([check_workspace_pattern(p, "--fetch") for p in flags.fetch]),
        "fetch",
    )  # fmt: skip
    allow_secrets = _unique(
        [check_workspace_pattern(item, "--allow-secret") for item in flags.allow_secrets]
    )
    sources["allow_secrets"] = "--allow-secret" if allow_secrets else "default"
    env = _merged_env(flags.env, defaults, sources)
    requirements = _requirements(flags.requirements, cwd, workdir, defaults, sources)
    out = _out_dir(flags.out, run_id, cwd, sources)
    exclude = [*defaults.exclude, *(check_exclude_pattern(p) for p in flags.exclude)]
    places = [defaults.source] if "exclude" in defaults.keys else []
    places += ["--exclude"] if flags.exclude else []
    sources["exclude"] = " + ".join(places) or "default"
    if out.is_relative_to(workdir):
        # Artifacts landing inside the workspace must never ride up with the next upload.
        exclude.append("/" + out.relative_to(workdir).as_posix() + "/")
    return WorkloadSpec(
        command=command,
        workdir=workdir,
        out=out,
        env=env,
        with_packages=with_packages,
        requirements=requirements,
        fetch=fetch,
        exclude=_unique(exclude),
        allow_secrets=allow_secrets,
        max_upload=_size(
            flags.max_upload, "--max-upload", DEFAULT_MAX_UPLOAD, sources, "max_upload"
        ),
        max_fetch=_size(flags.max_fetch, "--max-fetch", DEFAULT_MAX_FETCH, sources, "max_fetch"),
        timeout=_timeout(flags.timeout, sources),
        quiet=flags.quiet,
        all_output=_all_output(flags),
        sources={**sources, "quiet": "--quiet" if flags.quiet else "default"},
    )


def _all_output(flags: WorkloadFlags) -> bool:
    """--all-output streams more and --quiet streams nothing: both at once is a mistake."""
    if flags.all_output and flags.quiet:
        raise ConfigError(
            "--all-output and --quiet contradict each other.",
            hint="Keep --quiet to log every worker's output without streaming it, or "
            "--all-output to stream every worker's.",
        )
    return flags.all_output


def _merged_env(
    items: Sequence[str], defaults: ProjectDefaults, sources: dict[str, str]
) -> tuple[tuple[str, str], ...]:
    merged = dict(defaults.env)
    merged.update(check_env(item) for item in items)
    places = [defaults.source] if defaults.env else []
    places += ["--env"] if items else []
    sources["env"] = " + ".join(places) or "default"
    return tuple(merged.items())


def _requirements(
    flag: str | None, cwd: Path, workdir: Path, defaults: ProjectDefaults, sources: dict[str, str]
) -> RequirementsFile | None:
    path = _requirements_path(flag, cwd, defaults, sources)
    # Its references are checked against the workspace now, before anything is created.
    return None if path is None else read_requirements(path, workdir=workdir, cwd=cwd)


def _requirements_path(
    flag: str | None, cwd: Path, defaults: ProjectDefaults, sources: dict[str, str]
) -> Path | None:
    if flag is None:
        sources["requirements"] = defaults.source if defaults.requirements else "default"
        return defaults.requirements
    if not flag.strip():
        raise ConfigError("--requirements is empty.", hint="Pass a file, or leave it out.")
    hint = "Pass an existing, readable requirements file."
    path = resolve_local(cwd / Path(flag).expanduser(), "--requirements", hint=hint)
    if path.exists() and not path.is_file():
        raise ConfigError(f"--requirements {flag} is not a file.", hint="Pass a file.")
    try:
        with path.open("rb"):
            pass
    except OSError as error:
        raise ConfigError(
            f"--requirements {flag}: cannot read {path} ({error.strerror}).",
            hint=hint,
        ) from None
    sources["requirements"] = "--requirements"
    return path


def _out_dir(flag: str | None, run_id: str, cwd: Path, sources: dict[str, str]) -> Path:
    """--out (default ./tpulab-runs/<run id>/), proven creatable and writable now: the
    artifacts of a billed VM must have somewhere to land (tpulab.config.local_paths)."""
    if flag is None:
        sources["out"] = "default"
        hint = (
            f"The default --out is ./{RUNS_DIR}/<run id>/ in the current directory ({cwd}); "
            "run from a writable directory or pass --out DIR on a writable disk."
        )
        path = resolve_local(cwd / RUNS_DIR / run_id, "--out (default)", hint=hint)
        check_utf8(path, "--out (default)", hint=hint)
        prove_creatable(path, "--out (default)", hint=hint)
        return path
    if not flag.strip():
        raise ConfigError("--out is empty.", hint="Pass a directory, or leave --out out.")
    hint = (
        "Pass --out DIR, a new or empty directory on a writable disk (its parent may be "
        f"missing: it is created), or leave --out out for ./{RUNS_DIR}/<run id>/."
    )
    path = resolve_local(cwd / Path(flag).expanduser(), "--out", hint=hint)
    check_utf8(path, "--out", hint=hint)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path} is a file.", hint="Pass a directory for the artifacts.")
    if path.is_dir() and _has_entries(path, hint):
        # Two runs' artifacts in one directory could not be told apart (or would overwrite).
        raise ConfigError(
            f"--out {path} is not empty.",
            hint=f"Pass a new or empty directory, or leave --out out for ./{RUNS_DIR}/<run id>/.",
        )
    prove_creatable(path, "--out", hint=hint)
    sources["out"] = "--out"
    return path


def _has_entries(path: Path, hint: str) -> bool:
    try:
        return any(path.iterdir())
    except OSError as error:
        raise ConfigError(f"--out {path} cannot be listed: {error.strerror}.", hint=hint) from None


def _size(flag: str | None, option: str, default: int, sources: dict[str, str], name: str) -> int:
    sources[name] = option if flag is not None else "default"
    return default if flag is None else parse_size(option, flag)


def _timeout(flag: float | None, sources: dict[str, str]) -> float:
    sources["timeout"] = "--timeout" if flag is not None else "default"
    return DEFAULT_COMMAND_TIMEOUT if flag is None else check_seconds("--timeout", flag)
