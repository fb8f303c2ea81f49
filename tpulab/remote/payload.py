"""How the verifier payload is invoked, shared by the local run and the remote lifecycle.

One builder for the argv and one for the environment, so `tpulab verify --local` and
`tpulab run` start the payload the same way: the platform named twice (JAX_PLATFORMS, so
JAX cannot fall back, and --platform, so the payload asks for it by name) and, on CPU, the
device count forced to what the accelerator would show.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from pathlib import Path

from tpulab.errors import ConfigError

__all__ = [
    "PAYLOAD_NAME",
    "RECEIPT_PREFIX",
    "check_nonce",
    "extract_receipt_line",
    "merged_env",
    "payload_command",
    "payload_env",
]

PAYLOAD_NAME = "verify_tpu.py"
RECEIPT_PREFIX = "TPULAB_RECEIPT "
_PLATFORMS = ("cpu", "tpu", "gpu")
_NONCE_CHARS = frozenset(string.ascii_letters + string.digits + "-_")


def _check_platform(platform: str) -> str:
    if platform not in _PLATFORMS:
        raise ConfigError(
            f"Unknown platform {platform!r}.", hint="Use one of: " + ", ".join(_PLATFORMS)
        )
    return platform


def check_nonce(nonce: str) -> str:
    """Nonces travel on a command line; keep them to a harmless alphabet and length."""
    if not 8 <= len(nonce) <= 128 or not set(nonce) <= _NONCE_CHARS:
        raise ConfigError(
            f"Invalid nonce {nonce!r}.",
            hint="Use 8-128 characters of letters, digits, '-' or '_' (secrets.token_hex).",
        )
    return nonce


def payload_command(
    python: str,
    payload: str | Path,
    *,
    platform: str,
    nonce: str,
    out: str | Path,
    emulated: bool,
) -> list[str]:
    """argv that runs the payload; `out` is where it writes the receipt JSON."""
    argv = [
        python,
        str(payload),
        "--platform",
        _check_platform(platform),
        "--nonce",
        check_nonce(nonce),
        "--out",
        str(out),
    ]
    return [*argv, "--emulated"] if emulated else argv


def payload_env(platform: str, devices: int) -> dict[str, str]:
    """Environment additions for the payload process (merge them over the inherited env).

    On CPU the device count comes from XLA's host-platform flag, so an emulated
    v5litepod-4 shows 4 devices; on a TPU the hardware decides and the flag is not set.
    """
    if devices < 1:
        raise ConfigError(f"Invalid device count {devices}.", hint="Use 1 or more devices.")
    env = {"JAX_PLATFORMS": _check_platform(platform)}
    if platform == "cpu":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def extract_receipt_line(output: bytes | str) -> bytes | None:
    """The receipt from the payload's stdout (last prefixed line), or None."""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    found: str | None = None
    for line in text.splitlines():
        if line.startswith(RECEIPT_PREFIX):
            found = line[len(RECEIPT_PREFIX) :]
    return found.encode("utf-8") if found is not None else None


def merged_env(base: Mapping[str, str], platform: str, devices: int) -> dict[str, str]:
    """`base` with the payload's settings on top (replacing any inherited XLA_FLAGS)."""
    return {**base, **payload_env(platform, devices)}
