"""Where tpulab keeps things on this machine.

`TPULAB_HOME` overrides everything (tests point it at a temporary directory so they never
touch the user's real receipts or journal); otherwise platformdirs picks the usual places.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from pathlib import Path

__all__ = [
    "data_dir",
    "emulator_state_dir",
    "existing_owner_id",
    "journal_path",
    "owner_id",
    "owner_id_path",
    "payload_path",
    "receipts_dir",
    "state_dir",
]


def _home_override() -> Path | None:
    value = os.environ.get("TPULAB_HOME")
    if not value:
        return None
    home = Path(value).expanduser()
    if not home.is_absolute():
        # Relative, it would be another home in each directory tpulab runs from: a
        # session `up` made in one would be unknown to `down` in another, and the
        # journal a teardown reads would not be the one the run wrote.
        from tpulab.errors import ConfigError

        raise ConfigError(
            f"TPULAB_HOME is a relative path ({value!r}): tpulab would keep a different "
            "journal, receipts and sessions in each directory it runs from.",
            hint=f"Give an absolute path, e.g. TPULAB_HOME=$PWD/{value} (or ~/{value}).",
        )
    return home


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


# An owner id is a GCP label value ([a-z0-9_-], at most 63): the host's name, for the
# humans who read "live elsewhere (owner ...)", then 12 random hex digits, so two homes
# on one host (two TPULAB_HOMEs, two users) never share one.
_OWNER_ID = re.compile(r"^[a-z0-9_-]{1,63}$")


def owner_id_path() -> Path:
    return state_dir() / "owner-id"


def existing_owner_id() -> str | None:
    """This home's owner id if one was made (and is intact); never writes."""
    try:
        found = owner_id_path().read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return found if _OWNER_ID.match(found) else None


def owner_id() -> str:
    """This tpulab home's owner id: made once (by whichever process comes first), kept
    beside the journal, stamped on every node as its `tpulab-owner` label. A file that
    is damaged (not a label value) is replaced: the id only names, it grants nothing."""
    existing = existing_owner_id()
    if existing is not None:
        return existing
    path = owner_id_path()
    found = path.exists()
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")[:40]
    made = f"{host or 'host'}-{secrets.token_hex(6)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".owner-id.{os.getpid()}.{secrets.token_hex(4)}")
    aside.write_text(made + "\n", encoding="ascii")
    try:
        if found:
            os.replace(aside, path)  # damaged: this one takes its place
            return owner_id()
        os.link(aside, path)  # fails if another process made one first: use that
    except FileExistsError:
        return owner_id()
    finally:
        aside.unlink(missing_ok=True)
    return made


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
