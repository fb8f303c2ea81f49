"""Which Python and JAX the VM's venv gets: the one place that chooses and validates them.

TPU VM images ship Python 3.10, and JAX 0.7.0 needs 3.11 (current JAX 3.12), so real
runs default to a uv-managed 3.12 (MaxText's fix). Emulated nodes run on this machine,
where uv cannot download a managed Python (no network beyond the package registries),
so they ask for ">=3.11": uv then takes the newest local interpreter that qualifies,
and the summary says which it was. `system` keeps the image's own python3.
"""

from __future__ import annotations

import re

from tpulab.config.resolve import Resolved
from tpulab.errors import ConfigError

__all__ = [
    "EMULATED_PYTHON",
    "REAL_PYTHON",
    "SYSTEM_PYTHON",
    "check_jax_version",
    "check_python_request",
    "choose_python",
]

REAL_PYTHON = "3.12"
EMULATED_PYTHON = ">=3.11"
SYSTEM_PYTHON = "system"

# "3.12", ">=3.11" or "system": payloads must still run on 3.10, so nothing older.
_REQUEST = re.compile(r"^(>=)?3\.(1[0-9])$")
# A released JAX version as pip spells it: 0.6.2, 0.12.0.1, 0.5.0rc1.
_JAX_VERSION = re.compile(r"^[0-9]+(\.[0-9]+){1,3}((a|b|rc)[0-9]+)?(\.post[0-9]+)?$")


def check_python_request(request: str, option: str = "--python") -> str:
    """`request` if the bootstrap understands it, else ConfigError saying what would."""
    value = request.strip()
    if value == SYSTEM_PYTHON or _REQUEST.match(value):
        return value
    raise ConfigError(
        f"Invalid {option} {request!r}.",
        hint="Give X.Y (3.10 or newer, e.g. 3.12), >=X.Y, or 'system' for the image's own "
        "python3 (3.10 on TPU VM images, which limits jax to 0.6.x).",
    )


def check_jax_version(version: str) -> str:
    value = version.strip()
    if _JAX_VERSION.match(value):
        return value
    raise ConfigError(
        f"Invalid --jax-version {version!r}.",
        hint="Give a released version such as 0.6.2 (without 'jax==' or extras); omit "
        "the flag for the newest jax the venv's python supports.",
    )


def choose_python(
    requested: str | None, *, emulated: bool, from_file: Resolved | None = None
) -> tuple[str, str]:
    """(request, where the choice came from), for the RunSpec, the dry run and summary.

    `from_file` is the workspace's [tool.tpulab] python, used when --python is absent.
    """
    if requested is not None:
        return check_python_request(requested), "--python"
    if from_file is not None:
        try:
            return check_python_request(from_file.value, "python"), from_file.source
        except ConfigError as error:
            raise ConfigError(
                f"{error.message.rstrip('.')} (from {from_file.source}).", hint=error.hint
            ) from None
    if emulated:
        return EMULATED_PYTHON, "emulated default: the newest local python >= 3.11"
    return REAL_PYTHON, "default: uv-managed, as current jax needs python >= 3.12"
