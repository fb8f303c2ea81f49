"""Make `~/jax-tpu-lab/.venv` on the VM hold a working JAX, idempotently.

Steps, each one remote command (`--dry-run` records them as the run sends them):

1. `venv`: create the directory and the venv unless a working one exists. TPU VM images
   may lack ensurepip ("ensurepip is not available"); the fallbacks are tried in order
   and the path taken is reported: `uv venv`, `venv --without-pip` + get-pip,
   `sudo apt-get install -y python3-venv`. When uv is already on the host we start with
   `uv venv`: it needs no ensurepip and takes milliseconds instead of seconds.
2. `probe`: ask the venv's python which versions it resolves (python, jax, jaxlib,
   libtpu, numpy). If the requirements are met the install is skipped, so re-running
   the bootstrap on the same VM is a no-op. Emulated hosts ship an "image" whose python
   already finds jax and numpy (PYTHONPATH), so there the install is normally skipped.
3. `install`: `jax[tpu]` on a TPU, CPU `jax` on an emulated node, with uv by default
   (see tests/benchmarks/bench_bootstrap.py for why) and pip as the fallback; then the
   probe again, to record what was actually resolved.

Every command is an argv list; scripts get their variable parts as positional
parameters ("$@"), never pasted into the shell text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from tpulab.errors import CommandFailedError, RemoteError

__all__ = [
    "INSTALLERS",
    "INSTALLER_MARKER",
    "LAB_DIR",
    "RECEIPT_PATH",
    "STAGED_PAYLOAD",
    "VENV_DIR",
    "VENV_MARKER",
    "VENV_PYTHON",
    "VERSIONS_MARKER",
    "BootstrapResult",
    "CommandResult",
    "RemoteShell",
    "bootstrap",
    "install_command",
    "probe_command",
    "requirements_for",
    "venv_command",
]

# Relative to the login directory: SSH sessions start in HOME, and a quoted "~" would not
# expand, so relative paths are the robust way to say "~/jax-tpu-lab".
LAB_DIR = "jax-tpu-lab"
VENV_DIR = f"{LAB_DIR}/.venv"
VENV_PYTHON = f"{VENV_DIR}/bin/python"
STAGED_PAYLOAD = f"{LAB_DIR}/verify_tpu.py"
RECEIPT_PATH = f"{LAB_DIR}/receipt.json"

Installer = Literal["uv", "pip"]
INSTALLERS: tuple[Installer, ...] = ("uv", "pip")
# The lines by which the remote scripts report back (the dry run answers with them too).
VERSIONS_MARKER = "TPULAB_VERSIONS "
VENV_MARKER = "TPULAB_VENV "
INSTALLER_MARKER = "TPULAB_INSTALLER "


class CommandResult(Protocol):
    @property
    def exit_status(self) -> int: ...

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...


class RemoteShell(Protocol):
    """The part of `tpulab.ssh.Connection` the bootstrap needs."""

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        on_line: Callable[[str, str], None] | None = None,
        check: bool = False,
    ) -> CommandResult: ...


_VENV_SCRIPT = r"""
lab=$1; venv=$2; prefer=$3
mkdir -p "$lab" || exit 30
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "" 2>/dev/null; then
  echo "TPULAB_VENV existing"; exit 0
fi
rm -rf "$venv"
if [ "$prefer" = uv ] && command -v uv >/dev/null 2>&1; then
  if uv venv -q --python python3 "$venv" >&2; then echo "TPULAB_VENV uv venv"; exit 0; fi
  rm -rf "$venv"
fi
if out=$(python3 -m venv "$venv" 2>&1); then echo "TPULAB_VENV python3 -m venv"; exit 0; fi
printf '%s\n' "$out" >&2
rm -rf "$venv"
case "$out" in *ensurepip*) ;; *) exit 31 ;; esac
echo "python3 -m venv failed because ensurepip is not available; trying fallbacks" >&2
if command -v uv >/dev/null 2>&1 && uv venv -q --python python3 "$venv" >&2; then
  echo "TPULAB_VENV uv venv (ensurepip missing)"; exit 0
fi
rm -rf "$venv"
if python3 -m venv --without-pip "$venv" >&2; then
  if command -v curl >/dev/null 2>&1; then get="curl -fsSL"; else get="wget -qO-"; fi
  if $get https://bootstrap.pypa.io/get-pip.py | "$venv/bin/python" - -q >&2; then
    echo "TPULAB_VENV venv --without-pip + get-pip (ensurepip missing)"; exit 0
  fi
fi
rm -rf "$venv"
if sudo -n apt-get install -y python3-venv >&2 && python3 -m venv "$venv" >&2; then
  echo "TPULAB_VENV sudo apt-get install python3-venv, then python3 -m venv"; exit 0
fi
echo "every way to create a virtual environment failed" >&2
exit 32
"""

_INSTALL_SCRIPT = r"""
venv=$1; installer=$2; shift 2
if [ "$installer" = uv ]; then
  uv=""
  if command -v uv >/dev/null 2>&1; then uv=uv
  elif [ -x "$venv/bin/uv" ]; then uv="$venv/bin/uv"
  elif "$venv/bin/python" -m pip install -q uv >&2; then uv="$venv/bin/uv"
  fi
  if [ -n "$uv" ]; then
    echo "TPULAB_INSTALLER uv"
    if "$uv" pip install --python "$venv/bin/python" -U "$@"; then exit 0; fi
  fi
  echo "uv was not usable; falling back to pip" >&2
fi
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  "$venv/bin/python" -m ensurepip --upgrade --default-pip >&2 || exit 41
fi
echo "TPULAB_INSTALLER pip"
exec "$venv/bin/python" -m pip install -U "$@"
"""

_PROBE = (
    "import importlib.metadata as m, json, platform\n"
    "def v(name):\n"
    "    try:\n"
    "        return m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "found = {n: v(n) for n in ('jax', 'jaxlib', 'numpy')}\n"
    "found['libtpu'] = v('libtpu') or v('libtpu-nightly')\n"
    "found['python'] = platform.python_version()\n"
    f"print({VERSIONS_MARKER!r} + json.dumps(found, sort_keys=True))\n"
)


def requirements_for(platform: str) -> list[str]:
    """What the venv must hold: jax[tpu] pulls libtpu from PyPI; CPU jax for emulation."""
    return ["jax[tpu]", "numpy"] if platform == "tpu" else ["jax", "numpy"]


def venv_command(installer: Installer = "uv") -> list[str]:
    return ["sh", "-c", _VENV_SCRIPT, "sh", LAB_DIR, VENV_DIR, installer]


def probe_command() -> list[str]:
    return [VENV_PYTHON, "-c", _PROBE]


def install_command(platform: str, installer: Installer = "uv") -> list[str]:
    return ["sh", "-c", _INSTALL_SCRIPT, "sh", VENV_DIR, installer, *requirements_for(platform)]


@dataclass
class BootstrapResult:
    venv_path: str  # how the venv came to be: "existing", "uv venv", "python3 -m venv"...
    install: str  # "skipped (already satisfied)" or the installer used
    versions: dict[str, str | None] = field(default_factory=dict)
    seconds: float = 0.0


def _marker(output: str, prefix: str) -> str | None:
    for line in output.splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


def _tail(result: CommandResult, lines: int = 20) -> str:
    text = (result.stdout + "\n" + result.stderr).strip().splitlines()
    return "\n".join(text[-lines:])


def _missing(versions: Mapping[str, str | None], platform: str) -> list[str]:
    needed = ["jax", "jaxlib", "numpy"] + (["libtpu"] if platform == "tpu" else [])
    return [name for name in needed if not versions.get(name)]


def _probe(shell: RemoteShell, timeout: float) -> dict[str, str | None]:
    result = shell.run(probe_command(), timeout=timeout)
    found = _marker(result.stdout, VERSIONS_MARKER)
    if result.exit_status != 0 or found is None:
        raise CommandFailedError(
            "The venv's python could not report its packages.",
            exit_status=result.exit_status,
            output_tail=_tail(result),
            hint="The venv may be broken; it is recreated on the next run of a fresh VM.",
        )
    versions: dict[str, str | None] = json.loads(found)
    return versions


def bootstrap(
    shell: RemoteShell,
    *,
    platform: str,
    installer: Installer = "uv",
    timeout: float = 1200.0,
    on_line: Callable[[str, str], None] | None = None,
    note: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BootstrapResult:
    """Ensure the remote venv exists and holds JAX for `platform`; report what happened.

    Raises CommandFailedError naming the step that failed, with the output's tail.
    """
    tell = note or (lambda _message: None)
    started = clock()
    deadline = started + timeout

    def left() -> float:
        remaining = deadline - clock()
        if remaining <= 0:
            raise RemoteError(
                f"The bootstrap did not finish within {timeout:.0f} s.",
                hint="Check the VM's network access to PyPI, or raise the bootstrap timeout.",
            )
        return remaining

    made = shell.run(venv_command(installer), timeout=left(), on_line=on_line)
    venv_path = _marker(made.stdout, VENV_MARKER)
    if made.exit_status != 0 or venv_path is None:
        raise CommandFailedError(
            f"Could not create the remote venv {VENV_DIR} (exit {made.exit_status}).",
            exit_status=made.exit_status,
            output_tail=_tail(made),
            hint="Creating a venv needs python3 with venv/ensurepip, uv, network access for "
            "get-pip, or passwordless sudo for apt-get; see the output above.",
        )
    tell(f"venv: {venv_path}")
    versions = _probe(shell, left())
    missing = _missing(versions, platform)
    if not missing:
        tell("install skipped: the venv already has " + _summary(versions))
        return BootstrapResult(
            venv_path, "skipped (already satisfied)", versions, clock() - started
        )
    tell(f"installing {' '.join(requirements_for(platform))} (missing: {', '.join(missing)})")
    done = shell.run(install_command(platform, installer), timeout=left(), on_line=on_line)
    used = _marker(done.stdout, INSTALLER_MARKER) or installer
    if done.exit_status != 0:
        raise CommandFailedError(
            f"Installing {' '.join(requirements_for(platform))} with {used} failed "
            f"(exit {done.exit_status}).",
            exit_status=done.exit_status,
            output_tail=_tail(done),
            hint="Check the VM's access to PyPI and the resolver output above.",
        )
    versions = _probe(shell, left())
    still = _missing(versions, platform)
    if still:
        raise CommandFailedError(
            f"After installing with {used}, the venv still lacks {', '.join(still)}.",
            exit_status=0,
            output_tail=_tail(done),
            hint="The resolver picked no wheel for this platform; see the output above.",
        )
    tell(f"installed with {used}: " + _summary(versions))
    return BootstrapResult(venv_path, used, versions, clock() - started)


def _summary(versions: Mapping[str, str | None]) -> str:
    keys = ("python", "jax", "jaxlib", "libtpu", "numpy")
    return ", ".join(f"{key} {versions[key]}" for key in keys if versions.get(key))
