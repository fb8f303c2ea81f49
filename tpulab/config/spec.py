"""The validated `RunSpec`: every input of a run, checked before anything is contacted.

Everything here is pure input handling: a `RunSpec` that exists has been validated, so
nothing billable is created from bad input (DESIGN.md §3, invariant 1).
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tpulab import catalog
from tpulab.config.python import REAL_PYTHON, check_jax_version, choose_python
from tpulab.config.resolve import AdcProject, Resolved, resolve_project, resolve_zone
from tpulab.errors import ConfigError
from tpulab.models import check_label, check_node_name, check_zone, tpulab_labels

__all__ = [
    "EMULATED_PROJECT",
    "EMULATED_ZONE",
    "SSH_USER",
    "Mode",
    "RunSpec",
    "Timeouts",
    "build_run_spec",
    "is_loopback_endpoint",
    "new_run_id",
]

Mode = Literal["google", "emulate", "endpoint"]

# The embedded emulator's defaults (the same ones `tpulab list --emulate` uses).
EMULATED_PROJECT = "tpulab-emulated"
EMULATED_ZONE = "us-central1-a"
# The login user our per-run key is registered for in metadata["ssh-keys"].
SSH_USER = "tpulab"


def new_run_id(now: float | None = None) -> str:
    """A run id that sorts by time and is a valid label value: 20261130t210405-3fa2c1."""
    stamp = time.strftime("%Y%m%dt%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


def is_loopback_endpoint(url: str) -> bool:
    """True for an emulator served on this machine (its nodes are CPU hosts)."""
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    return host in {"localhost", "127.0.0.1", "::1"} or host.startswith("127.")


@dataclass(frozen=True)
class Timeouts:
    """Deadlines (seconds) of each waiting phase; tests shrink them, users rarely should."""

    create: float = 900.0
    ready: float = 900.0
    host_key: float = 180.0
    connect: float = 180.0
    bootstrap: float = 1200.0
    payload: float = 600.0
    collect: float = 60.0
    teardown: float = 600.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (isinstance(value, int | float) and math.isfinite(value) and 0 < value <= 86400):
                raise ConfigError(
                    f"Invalid {name} timeout {value!r}.",
                    hint="Timeouts are seconds, greater than 0 and at most 86400 (a day).",
                )


@dataclass(frozen=True)
class RunSpec:
    """A validated request for one run. Built by `build_run_spec`; never from raw flags."""

    run_id: str
    accelerator: catalog.Accelerator
    project: Resolved
    zone: Resolved
    node_name: str
    mode: Mode
    spot: bool = False
    api_endpoint: str | None = None
    emulated: bool = False
    payload: Path | None = None  # None: the packaged verify_tpu.py
    timeouts: Timeouts = field(default_factory=Timeouts)
    ssh_user: str = SSH_USER
    # The venv's python ("3.12", ">=3.11", "system"), chosen by config/python.py, and
    # where that choice came from; a pinned jax version, or None for the newest.
    python: str = REAL_PYTHON
    python_source: str = "default"
    jax_version: str | None = None

    @property
    def platform(self) -> str:
        """What the payload must run on: an emulated node is a CPU host, never a TPU."""
        return "cpu" if self.emulated else "tpu"

    @property
    def labels(self) -> dict[str, str]:
        return tpulab_labels(self.run_id)


def build_run_spec(
    *,
    accelerator: str,
    mode: Mode,
    project: str | None = None,
    zone: str | None = None,
    name: str | None = None,
    spot: bool = False,
    api_endpoint: str | None = None,
    payload_timeout: float | None = None,
    timeouts: Timeouts | None = None,
    payload: Path | None = None,
    run_id: str | None = None,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
    python: str | None = None,
    jax_version: str | None = None,
) -> RunSpec:
    """Validate every input of a run before anything contacts the cloud (invariant 1).

    `mode` "emulate" defaults project and zone to the embedded emulator's; "endpoint"
    resolves them like a real run but falls back to those defaults (a local emulator
    accepts any project); "google" needs both resolved, ADC's project included.
    """
    accel = catalog.lookup_single_host(accelerator.strip())
    if mode == "endpoint":
        if not api_endpoint:
            raise ConfigError("--api-endpoint needs a URL.", hint="e.g. http://127.0.0.1:8470")
        from urllib.parse import urlsplit

        parts = urlsplit(api_endpoint)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ConfigError(
                f"Invalid API endpoint {api_endpoint!r}.",
                hint="Give a URL such as http://127.0.0.1:8470 (`tpulab emulator serve` "
                "prints it).",
            )
    elif api_endpoint:
        raise ConfigError(
            "--api-endpoint cannot be combined with --emulate.",
            hint="Use --emulate for the embedded emulator, or --api-endpoint URL for one "
            "served by `tpulab emulator serve`.",
        )
    env = os.environ if env is None else env
    if mode == "emulate":
        proj = Resolved(project, "--project") if project else Resolved(EMULATED_PROJECT, "emulator")
        zn = Resolved(check_zone(zone), "--zone") if zone else Resolved(EMULATED_ZONE, "emulator")
    elif mode == "endpoint":
        try:
            proj = resolve_project(project, env=env)
        except ConfigError:
            proj = Resolved(EMULATED_PROJECT, "emulator default")
        try:
            zn = resolve_zone(zone, env=env)
        except ConfigError as error:
            if zone:
                raise error from None
            zn = Resolved(EMULATED_ZONE, "emulator default")
    else:
        zn = resolve_zone(zone, env=env)
        proj = resolve_project(project, env=env, adc_project=adc_project)
    _check_project(proj.value)
    rid = run_id or new_run_id()
    check_label("tpulab-run", rid)
    node_name = check_node_name(name if name else f"tpulab-{rid}")
    timeouts = timeouts or Timeouts()
    if payload_timeout is not None:
        timeouts = dataclasses.replace(timeouts, payload=payload_timeout)
    if payload is not None and not payload.is_file():
        raise ConfigError(f"Payload {payload} does not exist.", hint="Pass an existing file.")
    emulated = mode == "emulate" or (
        mode == "endpoint" and is_loopback_endpoint(api_endpoint or "")
    )
    python_request, python_source = choose_python(python, emulated=emulated)
    return RunSpec(
        run_id=rid,
        accelerator=accel,
        project=proj,
        zone=zn,
        node_name=node_name,
        mode=mode,
        spot=spot,
        api_endpoint=api_endpoint,
        emulated=emulated,
        payload=payload,
        timeouts=timeouts,
        python=python_request,
        python_source=python_source,
        jax_version=check_jax_version(jax_version) if jax_version is not None else None,
    )


def _check_project(project: str) -> None:
    # Project ids: 6-30 chars of lowercase letters, digits, hyphens (older ones may carry a
    # "domain:" prefix). We only refuse what could never be one, e.g. a pasted URL.
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-.:")
    if not project or not set(project) <= allowed or len(project) > 100:
        raise ConfigError(
            f"Invalid project id {project!r}.",
            hint="A project id looks like my-project-123 (lowercase letters, digits, hyphens).",
        )
