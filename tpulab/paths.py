"""Where tpulab keeps things on this machine.

`TPULAB_HOME` overrides everything (tests point it at a temporary directory so they never
touch the user's real receipts or journal); otherwise platformdirs picks the usual places.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "data_dir",
    "emulator_state_dir",
    "journal_path",
    "payload_path",
    "receipts_dir",
    "state_dir",
]


def _home_override() -> Path | None:
    value = os.environ.get("TPULAB_HOME")
    return Path(value).expanduser() if value else None


def data_dir() -> Path:
    override = _home_override()
    if override is not None:
        return override / "data"
    import platformdirs

    return Path(platformdirs.user_data_dir("tpulab", appauthor=False))


def state_dir() -> Path:
    override = _home_override()
    if override is not None:
        return override / "state"
    import platformdirs

    return Path(platformdirs.user_state_dir("tpulab", appauthor=False))


def receipts_dir() -> Path:
    return data_dir() / "receipts"


def journal_path() -> Path:
    return state_dir() / "journal.sqlite3"


def emulator_state_dir() -> Path:
    return state_dir() / "emulator"


def payload_path(name: str = "verify_tpu.py") -> Path:
    """A remote payload script: inside the installed wheel, or the source checkout's."""
    package_dir = Path(__file__).resolve().parent
    for candidate in (
        package_dir / "remote_payloads" / name,
        package_dir.parent / "remote_payloads" / name,
    ):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"remote payload {name} is missing from this tpulab installation")
