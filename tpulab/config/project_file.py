"""A workspace's tpulab defaults: `[tool.tpulab]` in pyproject.toml, or a tpulab.toml.

Only the workspace root (the run's --workdir, default the current directory) is read, never
its parents: the workspace is what goes to the VM, so its own file is the one that speaks
for it. In tpulab.toml the keys sit at the top level; in pyproject.toml under
`[tool.tpulab]`. Both files naming tpulab settings is an error rather than a precedence
rule: two sources of defaults for one workspace would leave the user guessing which won.

Every key is checked when the file is read, with the file and the key in the message, and
an unknown key is an error listing the allowed ones: a typo (`acelerator`) silently
ignored would run with a different value than the user wrote.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpulab.config.local_paths import resolve_local
from tpulab.config.workload import (
    check_env,
    check_exclude_pattern,
    check_requirement,
    check_workspace_pattern,
)
from tpulab.errors import ConfigError

__all__ = ["ALLOWED_KEYS", "NO_PROJECT_FILE", "ProjectDefaults", "load_project_file"]

PYPROJECT = "pyproject.toml"
TPULAB_TOML = "tpulab.toml"
# What issue 12 #7 and DESIGN §1 let a workspace set; flags override each of them.
ALLOWED_KEYS = (
    "accelerator",
    "zone",
    "project",
    "python",
    "with",
    "requirements",
    "fetch",
    "env",
    "exclude",
    "network",
    "subnetwork",
    "service_account",
    "provider",
    "image",
)


@dataclass(frozen=True)
class ProjectDefaults:
    """The validated defaults of one workspace; `keys` says which the file actually set."""

    source: str = ""  # "pyproject.toml [tool.tpulab]" or "tpulab.toml"; "" when none
    path: Path | None = None
    keys: frozenset[str] = frozenset()
    accelerator: str | None = None
    project: str | None = None
    zones: tuple[str, ...] = ()
    python: str | None = None
    with_packages: tuple[str, ...] = ()
    requirements: Path | None = None  # absolute: relative paths are the file's directory's
    fetch: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    exclude: tuple[str, ...] = ()
    network: str | None = None
    subnetwork: str | None = None
    service_account: str | None = None
    provider: str | None = None  # tpu-api or compute (tpulab.catalog.PROVIDERS)
    image: str | None = None  # the Compute provider's boot image


NO_PROJECT_FILE = ProjectDefaults()


def load_project_file(workdir: Path) -> ProjectDefaults:
    """The defaults `workdir` declares, NO_PROJECT_FILE when it declares none."""
    found = [table for table in (_pyproject_table(workdir), _tpulab_toml(workdir)) if table]
    if not found:
        return NO_PROJECT_FILE
    if len(found) > 1:
        raise ConfigError(
            f"Both {workdir / PYPROJECT} [tool.tpulab] and {workdir / TPULAB_TOML} set tpulab "
            "defaults.",
            hint="Keep one of them: move the settings into one file and delete the other.",
        )
    path, source, table = found[0]
    return _validated(path, source, table)


def _read_toml(path: Path) -> dict[str, Any]:
    loads = _toml_loader(path)
    try:
        text = path.read_text(encoding="utf-8")
        return loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        # tomllib.TOMLDecodeError is a ValueError.
        raise ConfigError(
            f"Cannot read {path}: {error}",
            hint="Fix the file (it must be valid TOML), or run from another --workdir.",
        ) from None


def _toml_loader(path: Path) -> Callable[[str], dict[str, Any]]:
    # tomllib is 3.11+; on 3.10 tpulab depends on tomli (pyproject), kept as a fallback.
    for name in ("tomllib", "tomli"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        loads: Callable[[str], dict[str, Any]] = module.loads
        return loads
    raise ConfigError(
        f"Reading {path} needs Python 3.11 or newer (tomllib), or the tomli package.",
        hint="Run tpulab on Python >= 3.11, or `pip install tomli`.",
    )


def _pyproject_table(workdir: Path) -> tuple[Path, str, dict[str, Any]] | None:
    path = workdir / PYPROJECT
    if not path.is_file():
        return None
    tool = _read_toml(path).get("tool", {})
    table = tool.get("tpulab") if isinstance(tool, dict) else None
    if table is None:
        return None
    source = f"{PYPROJECT} [tool.tpulab]"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.tpulab] must be a table.", hint=_ALLOWED_HINT)
    return path, source, table


def _tpulab_toml(workdir: Path) -> tuple[Path, str, dict[str, Any]] | None:
    path = workdir / TPULAB_TOML
    if not path.is_file():
        return None
    return path, TPULAB_TOML, _read_toml(path)


_ALLOWED_HINT = "Allowed keys: " + ", ".join(ALLOWED_KEYS) + "."


def _validated(path: Path, source: str, table: Mapping[str, Any]) -> ProjectDefaults:
    unknown = sorted(set(table) - set(ALLOWED_KEYS))
    if unknown:
        raise ConfigError(
            f"Unknown key{'s' if len(unknown) > 1 else ''} "
            + ", ".join(repr(key) for key in unknown)
            + f" in {path} ({source}).",
            hint=_ALLOWED_HINT,
        )
    where = f"{path} ({source})"

    def text(key: str) -> str | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(
                f"{key} in {where} must be a non-empty string, not {value!r}.",
                hint=f'Write it as {key} = "VALUE", or remove the key.',
            )
        return value.strip()

    def strings(key: str, *, single: bool = False) -> tuple[str, ...]:
        value = table.get(key)
        if value is None:
            return ()
        if single and isinstance(value, str):
            value = [value]
        if not (
            isinstance(value, list)
            and value
            and all(isinstance(item, str) and item.strip() for item in value)
        ):
            form = f'"A" or {key} = ["A", "B"]' if single else '["A", "B"]'
            raise ConfigError(
                f"{key} in {where} must be a list of non-empty strings, not {value!r}.",
                hint=f"Write it as {key} = {form}, or remove the key.",
            )
        return tuple(dict.fromkeys(item.strip() for item in value))

    label = f"{source} {{}}"
    requirements = text("requirements")
    return ProjectDefaults(
        source=source,
        path=path,
        keys=frozenset(table),
        accelerator=text("accelerator"),
        project=text("project"),
        zones=strings("zone", single=True),
        python=text("python"),
        with_packages=tuple(
            check_requirement(item, label.format("with")) for item in strings("with")
        ),
        requirements=_requirements_file(path.parent, requirements, where),
        fetch=tuple(
            check_workspace_pattern(item, label.format("fetch")) for item in strings("fetch")
        ),
        env=_env_table(table.get("env"), where, label.format("env")),
        exclude=tuple(
            check_exclude_pattern(item, label.format("exclude")) for item in strings("exclude")
        ),
        network=text("network"),
        subnetwork=text("subnetwork"),
        service_account=text("service_account"),
        provider=text("provider"),
        image=text("image"),
    )


def _requirements_file(root: Path, value: str | None, where: str) -> Path | None:
    if value is None:
        return None
    hint = "Give a path relative to the workspace, or remove the key."
    path = resolve_local(root / value, f"requirements in {where}", hint=hint)
    if not path.is_file():
        raise ConfigError(
            f"requirements in {where} names {value!r}, which is not a file ({path}).",
            hint=hint,
        )
    return path


def _env_table(value: object, where: str, label: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(
        isinstance(name, str) and isinstance(item, str) for name, item in value.items()
    ):
        raise ConfigError(
            f"env in {where} must be a table of strings, not {value!r}.",
            hint="Write it as [tool.tpulab.env] (or [env] in tpulab.toml) with lines like "
            'WANDB_MODE = "offline" (quote numbers too).',
        )
    # One rule for names and reserved variables: the one --env uses.
    return tuple(check_env(f"{name}={item}", label) for name, item in value.items())
