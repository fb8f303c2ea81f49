"""Where a run's project and zone come from.

Resolution order (DESIGN.md §1), first hit wins:

    project: --project -> TPULAB_PROJECT -> CLOUDSDK_CORE_PROJECT -> GOOGLE_CLOUD_PROJECT
             -> the active gcloud configuration file -> Application Default Credentials
    zone:    --zone -> TPULAB_ZONE -> CLOUDSDK_COMPUTE_ZONE -> the active gcloud configuration

The gcloud configuration is read as a file (`$CLOUDSDK_CONFIG` or ~/.config/gcloud,
`active_config`, `configurations/config_NAME`), never by running gcloud: it is fast and
works offline. ADC is consulted last and only through a callable the caller passes,
because asking google-auth may touch the network (the GCE metadata server) and only
`tpulab.cloud.google` may import google.*.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpulab.errors import ConfigError
from tpulab.models import check_zone

__all__ = [
    "AdcProject",
    "Resolved",
    "gcloud_config_value",
    "resolve_project",
    "resolve_zone",
    "resolve_zones",
]

AdcProject = Callable[[], "str | None"]


@dataclass(frozen=True)
class Resolved:
    """A configuration value and the place it came from (shown in the plan and --json)."""

    value: str
    source: str


def _gcloud_dir(env: Mapping[str, str]) -> Path:
    override = env.get("CLOUDSDK_CONFIG")
    if override:
        return Path(override).expanduser()
    return Path(env.get("HOME", str(Path.home()))) / ".config" / "gcloud"


def gcloud_config_value(
    section: str, key: str, env: Mapping[str, str] | None = None
) -> Resolved | None:
    """`[section] key` of the active gcloud configuration, read from disk, or None."""
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
    value = parser.get(section, key, fallback="").strip()
    if not value:
        return None
    return Resolved(value, f"gcloud configuration '{name}' ({path})")


def _first_env(env: Mapping[str, str], names: Sequence[str]) -> Resolved | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return Resolved(value, f"${name}")
    return None


def resolve_project(
    flag: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
) -> Resolved:
    """The project for API calls; ConfigError naming every place that was looked at."""
    env = os.environ if env is None else env
    if flag:
        return Resolved(flag, "--project")
    found = _first_env(env, ("TPULAB_PROJECT", "CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT"))
    found = found or gcloud_config_value("core", "project", env)
    if found is None and adc_project is not None:
        project = adc_project()
        if project:
            found = Resolved(project, "Application Default Credentials")
    if found is None:
        raise ConfigError(
            "No Google Cloud project is configured.",
            hint="Pass --project, set TPULAB_PROJECT, or run `gcloud config set project "
            "PROJECT_ID` (looked at: --project, $TPULAB_PROJECT, $CLOUDSDK_CORE_PROJECT, "
            "$GOOGLE_CLOUD_PROJECT, the active gcloud configuration"
            + (", Application Default Credentials)." if adc_project else ")."),
        )
    return found


def resolve_zone(flag: str | None = None, *, env: Mapping[str, str] | None = None) -> Resolved:
    """The zone for a run, validated; ConfigError naming where it was looked for."""
    env = os.environ if env is None else env
    found = Resolved(flag, "--zone") if flag else None
    found = found or _first_env(env, ("TPULAB_ZONE", "CLOUDSDK_COMPUTE_ZONE"))
    found = found or gcloud_config_value("compute", "zone", env)
    if found is None:
        raise ConfigError(
            "No zone is configured.",
            hint="Pass --zone (e.g. --zone us-central1-a), set TPULAB_ZONE, or run "
            "`gcloud config set compute/zone ZONE`.",
        )
    check_zone(found.value)
    return found


def resolve_zones(flags: Sequence[str] = (), *, env: Mapping[str, str] | None = None) -> list[str]:
    """Zones for commands that scan (list, teardown): the flags, else the one resolved zone."""
    if flags:
        return [check_zone(zone) for zone in dict.fromkeys(flags)]
    return [resolve_zone(None, env=env).value]
