"""Where a run's project and zone come from.

Resolution order (docs/architecture.md §1), first hit wins:

    project: --project -> TPULAB_PROJECT -> CLOUDSDK_CORE_PROJECT -> GOOGLE_CLOUD_PROJECT
             -> the workspace's [tool.tpulab] (or tpulab.toml) -> the active gcloud
             configuration file -> Application Default Credentials
    zone:    --zone -> TPULAB_ZONE -> CLOUDSDK_COMPUTE_ZONE -> the workspace's [tool.tpulab]
             -> the active gcloud configuration

The workspace's file (config/project_file.py) is read by the caller and passed in as a
`Resolved` (its value and the file it came from), so this module stays about the order.

The gcloud configuration is read as a file (`$CLOUDSDK_CONFIG` or ~/.config/gcloud,
`active_config`, `configurations/config_NAME`), never by running gcloud: it is fast and
works offline. ADC is consulted last and only through a callable the caller passes,
because asking google-auth may touch the network (the GCE metadata server) and only
`tpulab.cloud.google` (and its error translation) may import google.*.

A value that is present but empty or malformed is an error naming where it came from,
wherever it came from (flag, environment, gcloud file): falling through to the next
source or to a default would quietly widen or move what a command acts on.
"""

from __future__ import annotations

import configparser
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpulab.errors import ConfigError
from tpulab.models import check_project, check_zone

__all__ = [
    "AdcProject",
    "Resolved",
    "check_seconds",
    "find_project",
    "find_zone",
    "format_duration",
    "gcloud_config_value",
    "given",
    "out_of_range",
    "parse_duration",
    "project_flag",
    "resolve_project",
    "resolve_zone",
    "resolve_zones",
    "zone_flags",
    "zone_from_env",
]

AdcProject = Callable[[], "str | None"]

_PROJECT_ENV = ("TPULAB_PROJECT", "CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT")
_ZONE_ENV = ("TPULAB_ZONE", "CLOUDSDK_COMPUTE_ZONE")


@dataclass(frozen=True)
class Resolved:
    """A configuration value and the place it came from (shown in the plan and --json)."""

    value: str
    source: str


def given(value: str | None, option: str, *, hint: str) -> str | None:
    """A flag's value, None when it was not passed; an empty value is an error, because
    "not given" must be said by leaving the flag out, never by ''."""
    if value is not None and not value.strip():
        raise ConfigError(f"{option} is empty.", hint=hint)
    return value


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# One or more "<number><unit>" parts ("90s", "10m", "1h30m"); a bare number is seconds.
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(option: str, text: str) -> float:
    """A duration flag ("20s", "10m", "1h", "1h30m", or bare seconds "90") in seconds.

    Only the shape is checked here (finite, above 0); each option applies its own upper
    bound, because a retry budget and a VM lease have different sensible ranges.
    """
    raw = text.strip().lower()
    hint = f"Pass {option} as a number with a unit, e.g. 20s, 10m, 1h or 1h30m."
    seconds: float | None = None
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        seconds = float(raw)
    elif raw and _DURATION_PART.sub("", raw) == "":
        seconds = sum(
            float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(raw)
        )
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"Invalid {option} {text!r}.", hint=hint)
    return seconds


def format_duration(seconds: float) -> str:
    """`seconds` the way the duration flags are written: "30d", "1h30m", "90s" ->
    "1m30s", "0.5s" (never "2.592e+06 s"). Whole seconds from a minute on."""
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    left = round(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def out_of_range(
    option: str, text: str, seconds: float, low: float, high: float, *, high_is: str = ""
) -> str:
    """The message for a duration outside [low, high], naming the bound it broke
    (`high_is` says where the maximum comes from, e.g. "the --ttl")."""
    if seconds < low:
        return f"{option} {text!r} is too short: the minimum is {format_duration(low)}."
    source = f" ({high_is})" if high_is else ""
    return f"{option} {text!r} is too long: the maximum is {format_duration(high)}{source}."


def _validated(found: Resolved, check: Callable[[str], str]) -> Resolved:
    try:
        check(found.value)
    except ConfigError as error:
        raise ConfigError(
            f"{error.message.rstrip('.')} (from {found.source}).", hint=error.hint
        ) from None
    return found


def _gcloud_dir(env: Mapping[str, str]) -> Path:
    override = env.get("CLOUDSDK_CONFIG")
    if override:
        return Path(override).expanduser()
    return Path(env.get("HOME", str(Path.home()))) / ".config" / "gcloud"


def gcloud_config_value(
    section: str, key: str, env: Mapping[str, str] | None = None
) -> Resolved | None:
    """`[section] key` of the active gcloud configuration, read from disk, or None.

    A key that is present but empty is a ConfigError: gcloud removes unset keys, so an
    empty one is a broken file, not a choice to fall back.
    """
    env = os.environ if env is None else env
    root = _gcloud_dir(env)
    name = env.get("CLOUDSDK_ACTIVE_CONFIG_NAME", "").strip()
    if not name:
        try:
            name = (root / "active_config").read_text(encoding="utf-8").strip()
        except OSError:
            name = "default"
    path = root / "configurations" / f"config_{name or 'default'}"
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        # A file gcloud itself could not parse either; treat it as absent, not fatal.
        return None
    raw = parser.get(section, key, fallback=None)
    if raw is None:
        return None
    source = f"gcloud configuration '{name}' ({path})"
    if not raw.strip():
        raise ConfigError(
            f"{section}/{key} is empty in the {source}.",
            hint=f"Run `gcloud config set {section}/{key} VALUE` or "
            f"`gcloud config unset {section}/{key}`.",
        )
    return Resolved(raw.strip(), source)


def _first_env(env: Mapping[str, str], names: Sequence[str]) -> Resolved | None:
    for name in names:
        if name not in env:
            continue
        value = env[name].strip()
        if not value:
            raise ConfigError(
                f"${name} is set but empty.",
                hint=f"Give it a value, or unset it (`unset {name}`).",
            )
        return Resolved(value, f"${name}")
    return None


def project_flag(flag: str | None) -> Resolved | None:
    """--project alone, validated; None when it was not passed."""
    if given(flag, "--project", hint="Pass a project id, or leave --project out.") is None:
        return None
    return _validated(Resolved(str(flag), "--project"), check_project)


def find_project(
    flag: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
    project_file: Resolved | None = None,
) -> Resolved | None:
    """The first configured project, validated; None when no place names one."""
    env = os.environ if env is None else env
    found = project_flag(flag)
    if found is not None:
        return found
    found = (
        _first_env(env, _PROJECT_ENV) or project_file or gcloud_config_value("core", "project", env)
    )
    if found is None and adc_project is not None:
        project = adc_project()
        if project:
            found = Resolved(project, "Application Default Credentials")
    return None if found is None else _validated(found, check_project)


def resolve_project(
    flag: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
    project_file: Resolved | None = None,
) -> Resolved:
    """The project for API calls; ConfigError naming every place that was looked at."""
    found = find_project(flag, env=env, adc_project=adc_project, project_file=project_file)
    if found is None:
        raise ConfigError(
            "No Google Cloud project is configured.",
            hint="Pass --project, set TPULAB_PROJECT, or run `gcloud config set project "
            "PROJECT_ID` (looked at: --project, $TPULAB_PROJECT, $CLOUDSDK_CORE_PROJECT, "
            "$GOOGLE_CLOUD_PROJECT, the workspace's [tool.tpulab], the active gcloud "
            "configuration" + (", Application Default Credentials)." if adc_project else ")."),
        )
    return found


def zone_flags(flags: Sequence[str], source: str = "--zone") -> list[str]:
    """The --zone values (repeatable), each validated, duplicates dropped; `source` is
    where they came from (the workspace's file lists zones too), named in any error."""
    zones = []
    for zone in dict.fromkeys(flags):
        given(zone, source, hint="Pass a zone such as us-central1-a, or leave --zone out.")
        zones.append(_validated(Resolved(zone, source), check_zone).value)
    return zones


def zone_from_env(env: Mapping[str, str]) -> Resolved | None:
    """The zone the environment names ($TPULAB_ZONE...), which outranks the workspace's
    file (DESIGN §1's order), or None."""
    return _first_env(env, _ZONE_ENV)


def find_zone(
    flag: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    project_file: Resolved | None = None,
) -> Resolved | None:
    """The first configured zone, validated; None when no place names one."""
    env = os.environ if env is None else env
    if flag is not None:
        return Resolved(zone_flags([flag])[0], "--zone")
    found = (
        _first_env(env, _ZONE_ENV) or project_file or gcloud_config_value("compute", "zone", env)
    )
    return None if found is None else _validated(found, check_zone)


def resolve_zone(
    flag: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    project_file: Resolved | None = None,
) -> Resolved:
    """The zone for a run, validated; ConfigError naming where it was looked for."""
    found = find_zone(flag, env=env, project_file=project_file)
    if found is None:
        raise ConfigError(
            "No zone is configured.",
            hint="Pass --zone (e.g. --zone us-central1-a), set TPULAB_ZONE, set zone in the "
            "workspace's [tool.tpulab], or run `gcloud config set compute/zone ZONE`.",
        )
    return found


def resolve_zones(flags: Sequence[str] = (), *, env: Mapping[str, str] | None = None) -> list[str]:
    """Zones for commands that scan (list, teardown): the flags (each validated), else the
    configured zone, else none (the caller decides whether the journal can supply some)."""
    if flags:
        return zone_flags(flags)
    found = find_zone(None, env=env)
    return [] if found is None else [found.value]


def check_seconds(option: str, value: float) -> float:
    """A duration in seconds: finite, above 0 and at most a day (the one range rule)."""
    if not (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= 86400
    ):
        raise ConfigError(
            f"Invalid {option} {value!r}.",
            hint="Timeouts are positive numbers of seconds, at most 86400 (a day).",
        )
    return float(value)
