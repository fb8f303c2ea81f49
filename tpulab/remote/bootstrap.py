"""Make `~/jax-tpu-lab/.venv` on the VM hold a working JAX, idempotently.

Why not the image's python: TPU VM images are Ubuntu 22.04 with Python 3.10, and JAX
0.7.0 needs 3.11, current JAX 3.12, so `pip install -U "jax[tpu]"` there resolves jax
0.6.2. Like MaxText, the venv gets a uv-managed Python (`uv venv --python 3.12`); the
request ("3.12", ">=3.11" or "system" for the image's own) is chosen in config.

Steps, each one remote command (`--dry-run` records them as the run sends them):

1. `uv`: find uv (PATH, then `~/.local/bin`) or install it user-level with the image's
   `python3 -m pip install --user uv`. When that is impossible the venv falls back to
   the image's python3 and the result says so. Skipped for `--python system` with pip.
2. `venv`: create the directory and the venv unless a working one with the requested
   python exists (a venv of another python is recreated). A managed python comes from
   `uv venv --python REQUEST`. For the image's python, TPU VM images may lack ensurepip
   ("ensurepip is not available"); the fallbacks are tried in order and the path taken is
   reported: `uv venv`, `venv --without-pip` seeded by the image's own pip, get-pip,
   `sudo apt-get install -y python3-venv`. The step also reports the image's python3.
3. `probe`: ask the venv's python which versions it resolves (python, jax, jaxlib,
   libtpu, numpy). If the requirements are met (and a pinned jax matches) the install is
   skipped, so re-running the bootstrap on the same VM is a no-op.
4. `install`: `jax[tpu]` on a TPU, CPU `jax` on an emulated node (`==V` when pinned),
   with uv by default (see tests/benchmarks/bench_bootstrap.py for why) and pip as the
   fallback; then the probe again, to record what was actually resolved.
5. `extras` (only with `-- CMD`, after the verifier: `install_extras`): the user's
   `--with` packages and `--requirements` file, into the same venv after jax. A stamp in
   the venv (the sha256 of what was asked) makes a rerun on a ready venv install nothing;
   a venv that is recreated loses its stamp with it. Then the probe records the extras'
   resolved versions. A package the installer cannot find or resolve is a
   BootstrapError naming it.

Before each step that downloads (uv's own install with pip, a uv-managed Python, the
jax install), the step's script probes the source it is about to use (`_REACH`, a few
seconds at most): the package index uv or pip will read, found the way they find it
(UV_DEFAULT_INDEX / UV_INDEX_URL / uv.toml's index-url; PIP_INDEX_URL / pip.conf; else
https://pypi.org/simple), and uv's Python download source (UV_PYTHON_INSTALL_MIRROR, else
python-build-standalone's GitHub releases) unless downloads are off. A source that does
not answer ends the bootstrap at once, named (exit 44, `TPULAB_UNREACHABLE`), instead of
after the installer's own retries: what a VM without an external IP and without Cloud
NAT meets. Any HTTP answer counts as reached (the installer then says what it found).

Every command is an argv list; scripts get their variable parts as positional
parameters ("$@"), never pasted into the shell text.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from tpulab.config.python import SYSTEM_PYTHON, check_python_request
from tpulab.config.requirements import distribution_names
from tpulab.contract import EMULATED_IMAGE_ENV
from tpulab.errors import BootstrapError, CommandFailedError, RemoteError

__all__ = [
    "EXTRAS_MARKER",
    "EXTRAS_STAMP",
    "EXTRA_VERSIONS_MARKER",
    "INSTALLERS",
    "INSTALLER_MARKER",
    "LAB_DIR",
    "RECEIPT_PATH",
    "STAGED_PAYLOAD",
    "SYSTEM_PYTHON",
    "UNREACHABLE_EXIT",
    "UNREACHABLE_MARKER",
    "VENV_DIR",
    "VENV_MARKER",
    "VENV_PYTHON",
    "VERSIONS_MARKER",
    "BootstrapResult",
    "CommandResult",
    "Extras",
    "ExtrasResult",
    "RemoteShell",
    "bootstrap",
    "extras_command",
    "install_command",
    "install_extras",
    "needs_uv",
    "probe_command",
    "requirements_for",
    "uv_command",
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
EXTRAS_MARKER = "TPULAB_EXTRAS "
EXTRA_VERSIONS_MARKER = "TPULAB_EXTRA_VERSIONS "
# Inside the venv, so a recreated venv forgets what it had.
EXTRAS_STAMP = f"{VENV_DIR}/tpulab-extras.sha256"
STAGED_REQUIREMENTS = f"{LAB_DIR}/requirements.txt"
_UV_PREFIX = "TPULAB_UV "
UNREACHABLE_MARKER = "TPULAB_UNREACHABLE "
# The exit status of a step that stopped because a download source did not answer.
UNREACHABLE_EXIT = 44
# Seconds the probe gives each source to answer (a reachable index answers in well under
# one; an unreachable one would otherwise cost the installer's timeouts and retries).
REACH_TIMEOUT = 5
_NOTE_PREFIX = "TPULAB_NOTE "
_IMAGE_PREFIX = "TPULAB_IMAGE "
_IMAGE_KIND_PREFIX = "TPULAB_IMAGE_KIND "


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


# Can this VM reach the download source of KIND (argv[1]: "uv" or "pip" for that
# installer's package index, "python" for uv's Python downloads)? Stdlib only (Python
# 3.10), no single quotes (the scripts carry it as a quoted literal). Prints
# UNREACHABLE and exits 44 when the source does not answer; nothing to probe (offline,
# downloads off, a local path that exists) exits 0.
_REACH = """
import configparser, os, re, ssl, sys, urllib.error, urllib.parse, urllib.request
kind, timeout = sys.argv[1], float(sys.argv[2])
PYPI = "https://pypi.org/simple"
def env(name):
    return os.environ.get(name, "").strip()
def on(name):
    return env(name).lower() in ("1", "true", "yes", "on")
def config_dir():
    return env("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
def pip_index():
    if on("PIP_NO_INDEX"):
        return None
    if env("PIP_INDEX_URL"):
        return env("PIP_INDEX_URL").split()[0]
    files = ["/etc/xdg/pip/pip.conf", "/etc/pip.conf", os.path.expanduser("~/.pip/pip.conf"),
             os.path.join(config_dir(), "pip", "pip.conf")]
    if env("PIP_CONFIG_FILE") == os.devnull:
        files = []
    elif env("PIP_CONFIG_FILE"):
        files.append(env("PIP_CONFIG_FILE"))
    found = None
    for path in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (OSError, configparser.Error):
            continue
        for section in ("global", "install"):
            for key in ("index-url", "index_url"):
                if parser.has_option(section, key):
                    found = parser.get(section, key).split()[0]
    return found or PYPI
def uv_index():
    if on("UV_OFFLINE") or on("UV_NO_INDEX"):
        return None
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        if env(name):
            return env(name).split()[0]
    user = env("UV_CONFIG_FILE") or os.path.join(config_dir(), "uv", "uv.toml")
    for path in (user, "/etc/uv/uv.toml"):
        try:
            text = open(path, encoding="utf-8").read()
        except OSError:
            continue
        match = re.search(r"^\\s*index-url\\s*=\\s*[\\x22\\x27]([^\\x22\\x27]+)", text, re.M)
        if match:
            return match.group(1)
    return PYPI
def python_source():
    if on("UV_OFFLINE") or env("UV_PYTHON_DOWNLOADS").lower() in ("never", "manual", "0", "false"):
        return None
    return env("UV_PYTHON_INSTALL_MIRROR") or (
        "https://github.com/astral-sh/python-build-standalone/releases/download")
def shown(url):
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "") + (":" + str(parts.port) if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
def problem(url):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        path = urllib.request.url2pathname(parts.path) if parts.scheme == "file" else url
        return None if os.path.exists(path) else "no such file or directory"
    request = urllib.request.Request(shown(url), method="HEAD",
                                     headers={"User-Agent": "tpulab-bootstrap-probe"})
    try:
        urllib.request.urlopen(request, timeout=timeout).close()
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as error:
        if isinstance(error.reason, ssl.SSLError):
            return None
        return type(error.reason).__name__ + ": " + str(error.reason)
    except Exception as error:
        return type(error).__name__ + ": " + (str(error) or "no answer")
    return None
url = {"uv": uv_index, "pip": pip_index, "python": python_source}[kind]()
if url is not None:
    why = problem(url)
    if why is not None:
        print("TPULAB_UNREACHABLE", kind, shown(url), why.replace(chr(10), " "))
        sys.exit(44)
    print("TPULAB_REACHED", kind, shown(url))
"""
assert "'" not in _REACH
# How a step's script runs the probe: `reach KIND || exit 44` (a probe that could not
# run at all, e.g. no python3, decides nothing: only its own 44 stops the step).
_REACH_FUNCTION = (
    f"reach_code='{_REACH}'\n"
    + 'reach() { python3 -c "$reach_code" "$1" '
    + str(REACH_TIMEOUT)
    + "; [ $? -ne 44 ]; }\n"
)

# Finding uv: PATH first, then where `pip install --user` puts it (SSH commands do not
# read ~/.profile, so ~/.local/bin is not on their PATH). Shared by the scripts below.
_FIND_UV = r"""
uv=$(command -v uv 2>/dev/null) || uv=""
if [ -z "$uv" ] && [ -x "$HOME/.local/bin/uv" ]; then uv="$HOME/.local/bin/uv"; fi
"""

# One bootstrap step at a time in the lab directory (uv's own `pip install --user`, the
# venv, its installs): a step whose SSH connection dropped may still run on the VM when
# the run makes it again (tpulab.run.dropped), and two `uv venv` (uv #11219) or pip
# installs (pip #2361) into one place break it. The next waits for the lock (the
# earlier's children hold it too). flock(1) is util-linux's, Essential on Debian and
# Ubuntu images; an image without it runs the step unlocked.
_ONE_AT_A_TIME = f"""mkdir -p {LAB_DIR} || exit 30
exec 9>>{LAB_DIR}/.bootstrap.lock
! command -v flock >/dev/null 2>&1 || flock 9
"""

_UV_SCRIPT = (
    _REACH_FUNCTION
    + _ONE_AT_A_TIME
    + _FIND_UV
    + r"""
if [ -n "$uv" ] && "$uv" --version >/dev/null 2>&1; then echo "TPULAB_UV found $uv"; exit 0; fi
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "TPULAB_UV none (the image python3 has no pip to install uv with)"; exit 0
fi
reach pip || exit 44
# Ubuntu 22.04's pip needs no flag; a PEP 668 image (24.04) refuses without one.
if python3 -m pip install -q --user uv >&2 ||
   python3 -m pip install -q --user --break-system-packages uv >&2; then
  if [ -x "$HOME/.local/bin/uv" ]; then
    echo "TPULAB_UV installed $HOME/.local/bin/uv (python3 -m pip install --user uv)"; exit 0
  fi
fi
echo "TPULAB_UV none (python3 -m pip install --user uv failed; see above)"
"""
)

# Does the interpreter running this satisfy the request ("3.12" or ">=3.11")? A constant
# (no single quotes), so the venv script carries it as a quoted literal.
_MATCHES = (
    "import sys; want = sys.argv[1]; have = sys.version_info[:2]; "
    'need = tuple(int(p) for p in want.lstrip(">=").split(".")[:2]); '
    'sys.exit(0 if (have >= need if want.startswith(">=") else have == need) else 1)'
)
assert "'" not in _MATCHES


_VENV_SCRIPT = (
    r"""
lab=$1; venv=$2; want=$3; prefer=$4
"""
    + f"matches='{_MATCHES}'; kind_var={EMULATED_IMAGE_ENV}\n"
    + _REACH_FUNCTION
    + _ONE_AT_A_TIME
    + r"""mkdir -p "$lab" || exit 30
"""
    + _FIND_UV
    + r"""
image=$(python3 -c "import platform; print(platform.python_version())" 2>/dev/null) || image=""
echo "TPULAB_IMAGE python3 ${image:-missing}"
kind=$(printenv "$kind_var") && echo "TPULAB_IMAGE_KIND $kind"
target=$want
if [ "$want" = system ] || [ -z "$uv" ]; then
  if [ "$want" != system ]; then
    echo "uv is not available, so python $want cannot be provided; falling back to" \
      "the image python3 ${image:-?} (expect an older jax)" >&2
    echo "TPULAB_NOTE uv unavailable: the image python3 ${image:-?} instead of python $want"
  fi
  target=$(python3 -c "import sys; print(*sys.version_info[:2], sep=chr(46))") || target=none
fi
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$matches" "$target" 2>/dev/null; then
  echo "TPULAB_VENV existing"; exit 0
fi
if [ -e "$venv" ]; then echo "$venv is not python $target (or is broken); recreating it" >&2; fi
rm -rf "$venv"
if [ "$want" != system ] && [ -n "$uv" ]; then
  if ! "$uv" python find "$want" >/dev/null 2>&1; then reach python || exit 44; fi
  if "$uv" venv -q --python "$want" "$venv" >&2; then
    echo "TPULAB_VENV uv venv --python $want"; exit 0
  fi
  rm -rf "$venv"
  echo "uv could not provide python $want (see above)" >&2
  exit 33
fi
if [ "$prefer" = uv ] && [ -n "$uv" ]; then
  if "$uv" venv -q --python python3 "$venv" >&2; then echo "TPULAB_VENV uv venv"; exit 0; fi
  rm -rf "$venv"
fi
if out=$(python3 -m venv "$venv" 2>&1); then echo "TPULAB_VENV python3 -m venv"; exit 0; fi
printf "%s\n" "$out" >&2
rm -rf "$venv"
case "$out" in *ensurepip*) ;; *) exit 31 ;; esac
echo "python3 -m venv failed because ensurepip is not available; trying fallbacks" >&2
if [ -n "$uv" ] && "$uv" venv -q --python python3 "$venv" >&2; then
  echo "TPULAB_VENV uv venv (ensurepip missing)"; exit 0
fi
rm -rf "$venv"
# The image's own pip (python3-pip) can seed a pip-less venv: run as a directory it is
# a self-contained installer, so no download of get-pip is needed.
pipdir=$(python3 -c "import os, pip; print(os.path.dirname(pip.__file__))" 2>/dev/null) || pipdir=""
if [ -n "$pipdir" ] && python3 -m venv --without-pip "$venv" >&2; then
  if "$venv/bin/python" "$pipdir" install -q pip >&2; then
    echo "TPULAB_VENV venv --without-pip + the image pip (ensurepip missing)"; exit 0
  fi
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
)

_INSTALL_SCRIPT = (
    r"""
venv=$1; installer=$2; shift 2
"""
    + _REACH_FUNCTION
    + _ONE_AT_A_TIME
    + _FIND_UV
    + r"""
reach "$installer" || exit 44
if [ "$installer" = uv ]; then
  if [ -z "$uv" ] && [ -x "$venv/bin/uv" ]; then uv="$venv/bin/uv"; fi
  if [ -z "$uv" ] && "$venv/bin/python" -m pip install -q uv >&2; then uv="$venv/bin/uv"; fi
  if [ -n "$uv" ]; then
    echo "TPULAB_INSTALLER uv"
    # No -U: uv's --upgrade refetches every wheel, defeating its cache (10 s vs 2 s);
    # the install only runs when something is missing or a pinned jax differs.
    if "$uv" pip install --python "$venv/bin/python" "$@"; then exit 0; fi
  fi
  echo "uv was not usable; falling back to pip" >&2
  reach pip || exit 44
fi
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  "$venv/bin/python" -m ensurepip --upgrade --default-pip >&2 || exit 41
fi
echo "TPULAB_INSTALLER pip"
exec "$venv/bin/python" -m pip install -U "$@"
"""
)

_PROBE = (
    "import importlib.metadata as m, json, platform, sys\n"
    "def v(name):\n"
    "    try:\n"
    "        return m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "found = {n: v(n) for n in ('jax', 'jaxlib', 'numpy')}\n"
    "found['libtpu'] = v('libtpu') or v('libtpu-nightly')\n"
    "found['python'] = platform.python_version()\n"
    f"print({VERSIONS_MARKER!r} + json.dumps(found, sort_keys=True))\n"
    # The user's extra packages, by distribution name, when the argv names any.
    "if sys.argv[1:]:\n"
    f"    print({EXTRA_VERSIONS_MARKER!r} + "
    "json.dumps({n: v(n) for n in sys.argv[1:]}, sort_keys=True))\n"
)

# The user's extras: skipped when the venv's stamp says exactly these were installed;
# otherwise installed with uv (found as for jax) or pip, then stamped. Packages arrive
# as "$@", the requirements file as $5 (empty: none) and the directory the installer
# runs in as $6 (empty: HOME), never inside the script text. The installer runs in $6
# so that the file's relative paths resolve there as pip resolves them on the laptop
# (nested -r/-c relative to the file naming them, the rest relative to the directory).
_EXTRAS_SCRIPT = (
    r"""
venv=$1; installer=$2; stamp=$3; want=$4; reqs=$5; dir=$6; shift 6
"""
    + _ONE_AT_A_TIME
    + r"""if [ -r "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "TPULAB_EXTRAS satisfied (stamp $want)"; exit 0
fi
if [ -n "$reqs" ]; then set -- "$@" -r "$reqs"; fi
rm -f "$stamp"
"""
    + _FIND_UV
    + r"""
venv=$PWD/$venv; stamp=$PWD/$stamp
if [ -n "$dir" ] && ! cd "$dir"; then echo "tpulab: no synced workspace at $dir" >&2; exit 42; fi
done=""
if [ "$installer" = uv ]; then
  if [ -z "$uv" ] && [ -x "$venv/bin/uv" ]; then uv="$venv/bin/uv"; fi
  if [ -n "$uv" ]; then
    echo "TPULAB_INSTALLER uv"
    "$uv" pip install --python "$venv/bin/python" "$@" || exit $?
    done=uv
  fi
fi
if [ -z "$done" ]; then
  if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    "$venv/bin/python" -m ensurepip --upgrade --default-pip >&2 || exit 41
  fi
  echo "TPULAB_INSTALLER pip"
  "$venv/bin/python" -m pip install "$@" || exit $?
fi
printf "%s" "$want" > "$stamp"
echo "TPULAB_EXTRAS installed"
"""
)


def requirements_for(platform: str, jax_version: str | None = None) -> list[str]:
    """What the venv must hold: jax[tpu] pulls libtpu from PyPI; CPU jax for emulation."""
    jax = "jax[tpu]" if platform == "tpu" else "jax"
    return [f"{jax}=={jax_version}" if jax_version else jax, "numpy"]


def needs_uv(python: str, installer: Installer) -> bool:
    """The uv step runs unless neither the venv's python nor the install asks for uv."""
    return python != SYSTEM_PYTHON or installer == "uv"


def uv_command() -> list[str]:
    return ["sh", "-c", _UV_SCRIPT, "sh"]


def venv_command(installer: Installer = "uv", python: str = SYSTEM_PYTHON) -> list[str]:
    return [
        "sh",
        "-c",
        _VENV_SCRIPT,
        "sh",
        LAB_DIR,
        VENV_DIR,
        check_python_request(python),
        installer,
    ]


def probe_command(extras: Sequence[str] = ()) -> list[str]:
    """The venv's versions; `extras` adds those distributions' versions."""
    return [VENV_PYTHON, "-c", _PROBE, *extras]


def install_command(
    platform: str, installer: Installer = "uv", jax_version: str | None = None
) -> list[str]:
    return [
        "sh",
        "-c",
        _INSTALL_SCRIPT,
        "sh",
        VENV_DIR,
        installer,
        *requirements_for(platform, jax_version),
    ]


@dataclass(frozen=True)
class Extras:
    """What the user asked the venv to hold besides jax (`--with`, `--requirements`).

    `requirements_text` is the file's content. With `requirements_path` (relative to
    `install_dir`) the VM installs from that synced copy, the installer running in
    `install_dir` (the synced workspace) so that the file's relative references resolve
    as on the laptop; without it the text is staged alone to STAGED_REQUIREMENTS. The
    stamp covers the file, the nested -r/-c files (`nested_texts`) and where it is read,
    so editing any of them makes the next run install again.
    """

    packages: tuple[str, ...] = ()
    requirements_text: str | None = None
    nested_texts: tuple[str, ...] = ()
    requirements_path: str | None = None
    install_dir: str = ""

    def __bool__(self) -> bool:
        return bool(self.packages) or self.requirements_text is not None

    @property
    def staged(self) -> bool:
        """The file's text goes to STAGED_REQUIREMENTS (it is not in the workspace)."""
        return self.requirements_text is not None and self.requirements_path is None

    @property
    def stamp(self) -> str:
        wanted = {
            "with": sorted(self.packages),
            "requirements": self.requirements_text,
            "nested": list(self.nested_texts),
            "at": [self.install_dir, self.requirements_path],
        }
        return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()

    @property
    def names(self) -> list[str]:
        """Distribution names, for the probe: `--with`'s and those the files name."""
        found = [match.group(0) for line in self.packages if (match := _DIST_NAME.match(line))]
        if self.requirements_text is not None:
            found += distribution_names((self.requirements_text, *self.nested_texts))
        return list(dict.fromkeys(name.lower() for name in found))

    def describe(self) -> str:
        parts = list(self.packages)
        if self.requirements_text is not None:
            shown = self.requirements_path or "requirements"
            parts.append(f"-r {shown} ({len(self.names) - len(self.packages)} named)")
        return " ".join(parts)


_DIST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


@dataclass
class ExtrasResult:
    install: str  # "skipped (already satisfied)" or the installer used
    versions: dict[str, str | None] = field(default_factory=dict)
    seconds: float = 0.0


def extras_command(extras: Extras, installer: Installer = "uv") -> list[str]:
    if extras.requirements_path is not None:
        reqs, where = extras.requirements_path, extras.install_dir
    else:
        reqs, where = (STAGED_REQUIREMENTS if extras.staged else ""), ""
    return [
        "sh",
        "-c",
        _EXTRAS_SCRIPT,
        "sh",
        VENV_DIR,
        installer,
        EXTRAS_STAMP,
        extras.stamp,
        reqs,
        where,
        *extras.packages,
    ]


@dataclass
class BootstrapResult:
    venv_path: str  # how the venv came to be: "existing", "uv venv --python 3.12"...
    install: str  # "skipped (already satisfied)" or the installer used
    versions: dict[str, str | None] = field(default_factory=dict)
    seconds: float = 0.0
    python_request: str = SYSTEM_PYTHON  # what config asked for: "3.12", ">=3.11", "system"
    image_python: str | None = None  # the image's own python3 version
    image_kind: str | None = None  # emulated nodes only: "bare" or "preloaded" (+ detail)
    uv: str | None = None  # how uv was found or installed; None when not needed
    notes: list[str] = field(default_factory=list)  # fallbacks taken, said plainly
    extras: ExtrasResult | None = None  # the user's --with/--requirements, once installed


def _marker(output: str, prefix: str) -> str | None:
    for line in output.splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


def _markers(output: str, prefix: str) -> list[str]:
    return [line[len(prefix) :].strip() for line in output.splitlines() if line.startswith(prefix)]


def _tail(result: CommandResult, lines: int = 20) -> str:
    text = (result.stdout + "\n" + result.stderr).strip().splitlines()
    return "\n".join(text[-lines:])


def _missing(
    versions: Mapping[str, str | None], platform: str, jax_version: str | None = None
) -> list[str]:
    needed = ["jax", "jaxlib", "numpy"] + (["libtpu"] if platform == "tpu" else [])
    missing = [name for name in needed if not versions.get(name)]
    if jax_version and versions.get("jax") and versions.get("jax") != jax_version:
        missing.append(f"jax=={jax_version} (has {versions.get('jax')})")
    return missing


_SOURCES = {
    "uv": "uv's package index",
    "pip": "pip's package index",
    "python": "uv's Python download source",
}


def _stop_if_unreachable(result: CommandResult, step: str) -> None:
    """A step that stopped because a download source did not answer (its probe's
    UNREACHABLE line): CommandFailedError naming the source, the error and the ways out."""
    said = _marker(result.stdout, UNREACHABLE_MARKER)
    if said is None or result.exit_status != UNREACHABLE_EXIT:
        return
    kind, _, rest = said.partition(" ")
    url, _, why = rest.partition(" ")
    ways = (
        "use --python system (the image's python3: nothing to download), or set "
        "UV_PYTHON_INSTALL_MIRROR on the VM to a mirror it reaches"
        if kind == "python"
        else "set a package mirror the VM reaches (UV_DEFAULT_INDEX / PIP_INDEX_URL, or "
        "pip.conf, in the VM's image), or use --python system with such a mirror"
    )
    raise CommandFailedError(
        f"The VM cannot reach {url} ({_SOURCES.get(kind, kind)}): {why or 'no answer'}. "
        f"The bootstrap's {step} step stopped before downloading.",
        exit_status=result.exit_status,
        output_tail=_tail(result),
        hint="With --internal-ip the VM reaches the internet only through Cloud NAT on "
        "its subnetwork (`gcloud compute routers create ...` and `gcloud compute routers "
        "nats create ...`: `tpulab doctor --internal-ip` prints both for your project); "
        f"or {ways}.",
    )


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
    python: str = SYSTEM_PYTHON,
    jax_version: str | None = None,
    timeout: float = 1200.0,
    on_line: Callable[[str, str], None] | None = None,
    note: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BootstrapResult:
    """Ensure the remote venv exists with `python` and holds JAX for `platform`.

    Raises CommandFailedError naming the step that failed, with the output's tail.
    """
    tell = note or (lambda _message: None)
    started = clock()
    deadline = started + timeout
    result = BootstrapResult("", "", python_request=python)

    def left() -> float:
        remaining = deadline - clock()
        if remaining <= 0:
            raise RemoteError(
                f"The bootstrap did not finish within {timeout:.0f} s.",
                hint="Check the VM's network access to PyPI, or give it longer with "
                "--bootstrap-timeout.",
            )
        return remaining

    if needs_uv(python, installer):
        found = shell.run(uv_command(), timeout=left(), on_line=on_line)
        _stop_if_unreachable(found, "uv")
        result.uv = _marker(found.stdout, _UV_PREFIX) or "none (the uv step said nothing)"
        tell(f"uv: {result.uv}")
    made = shell.run(venv_command(installer, python), timeout=left(), on_line=on_line)
    _stop_if_unreachable(made, "venv")
    venv_path = _marker(made.stdout, VENV_MARKER)
    result.image_python = (_marker(made.stdout, _IMAGE_PREFIX) or "").removeprefix("python3 ")
    result.image_kind = _marker(made.stdout, _IMAGE_KIND_PREFIX)
    result.notes = _markers(made.stdout, _NOTE_PREFIX)
    for fallback in result.notes:
        tell(fallback)
    if made.exit_status != 0 or venv_path is None:
        managed = made.exit_status == 33
        raise CommandFailedError(
            f"Could not create the remote venv {VENV_DIR} with python {python} "
            f"(exit {made.exit_status}).",
            exit_status=made.exit_status,
            output_tail=_tail(made),
            hint="uv could not find or download that python; pass another --python X.Y, "
            "or --python system for the image's own."
            if managed
            else "Creating a venv needs python3 with venv/ensurepip, uv, the image's pip, "
            "network access for get-pip, or passwordless sudo for apt-get; see the output.",
        )
    result.venv_path = venv_path
    tell(f"venv: {venv_path} (image python3 {result.image_python or '?'})")
    versions = _probe(shell, left())
    missing = _missing(versions, platform, jax_version)
    if not missing:
        tell("install skipped: the venv already has " + _summary(versions))
        result.install = "skipped (already satisfied)"
        result.versions = versions
        result.seconds = clock() - started
        return result
    wanted = " ".join(requirements_for(platform, jax_version))
    tell(f"installing {wanted} (missing: {', '.join(missing)})")
    done = shell.run(
        install_command(platform, installer, jax_version), timeout=left(), on_line=on_line
    )
    _stop_if_unreachable(done, "install")
    used = _marker(done.stdout, INSTALLER_MARKER) or installer
    if done.exit_status != 0:
        raise CommandFailedError(
            f"Installing {wanted} with {used} failed (exit {done.exit_status}).",
            exit_status=done.exit_status,
            output_tail=_tail(done),
            hint="Check the VM's access to PyPI and the resolver output above"
            + ("; is that jax version published for this python?" if jax_version else "."),
        )
    versions = _probe(shell, left())
    still = _missing(versions, platform, jax_version)
    if still:
        raise CommandFailedError(
            f"After installing with {used}, the venv still lacks {', '.join(still)}.",
            exit_status=0,
            output_tail=_tail(done),
            hint="The resolver picked no wheel for this platform; see the output above.",
        )
    tell(f"installed with {used}: " + _summary(versions))
    result.install = used
    result.versions = versions
    result.seconds = clock() - started
    return result


def _summary(versions: Mapping[str, str | None]) -> str:
    keys = ("python", "jax", "jaxlib", "libtpu", "numpy")
    return ", ".join(f"{key} {versions[key]}" for key in keys if versions.get(key))


def _blamed(extras: Extras, output: str) -> list[str]:
    """The requested packages the installer's output names (uv and pip both quote the
    distribution they could not find or resolve); all of them when it names none."""
    text = output.lower()
    named = [name for name in extras.names if re.search(rf"\b{re.escape(name)}\b", text)]
    return named or extras.names


def install_extras(
    shell: RemoteShell,
    extras: Extras,
    *,
    installer: Installer = "uv",
    timeout: float = 1200.0,
    on_line: Callable[[str, str], None] | None = None,
    note: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ExtrasResult:
    """Install the user's extras into the venv (after jax), unless its stamp says they
    are there; record their resolved versions. The requirements file, if any, must
    already be on the VM: staged at STAGED_REQUIREMENTS, or synced with the workspace.
    Raises BootstrapError naming the package."""
    tell = note or (lambda _message: None)
    started = clock()
    done = shell.run(extras_command(extras, installer), timeout=timeout, on_line=on_line)
    if done.exit_status != 0:
        output = done.stdout + "\n" + done.stderr
        blamed = _blamed(extras, output)
        used = _marker(done.stdout, INSTALLER_MARKER) or installer
        # A file naming only paths or URLs (`-e ./pkg`) has no package name to blame.
        named = extras.requirements_path or "the --requirements file"
        what = ", ".join(blamed) or f"the requirements of {named}"
        raise BootstrapError(
            f"Installing your extra packages with {used} failed (exit {done.exit_status}): "
            f"{what} could not be installed.",
            packages=blamed,
            exit_status=done.exit_status,
            output_tail=_tail(done),
            hint="Check the name and version of each --with / --requirements entry (is a "
            "wheel published for the VM's python?), and whether they conflict with the "
            "installed jax; the resolver's words are above.",
        )
    said = _marker(done.stdout, EXTRAS_MARKER) or ""
    install = (
        "skipped (already satisfied)"
        if said.startswith("satisfied")
        else _marker(done.stdout, INSTALLER_MARKER) or installer
    )
    left = max(1.0, timeout - (clock() - started))
    probed = shell.run(probe_command(extras.names), timeout=left)
    found = _marker(probed.stdout, EXTRA_VERSIONS_MARKER)
    versions: dict[str, str | None] = json.loads(found) if found else {}
    missing = [name for name in extras.names if not versions.get(name)]
    if missing:
        raise BootstrapError(
            f"After installing your extras, the venv still lacks {', '.join(missing)}.",
            packages=missing,
            exit_status=done.exit_status,
            output_tail=_tail(done),
            hint="The requirement installed under another distribution name, or the "
            "install was undone; check the names given to --with / --requirements.",
        )
    tell(f"extras {install}: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    return ExtrasResult(install=install, versions=versions, seconds=clock() - started)
