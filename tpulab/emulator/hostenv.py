"""What an emulated TPU VM looks like from the inside, shared by both SSH host backends.

- `ImageEnv`: the environment the "VM image" gives every session. Two named images:
  `bare_image_env` starts like a real TPU VM image (an old `python3`, no jax, no uv on
  PATH, nothing of the controller's), so the bootstrap installs for real from the
  package index; `preloaded_image_env` points `PYTHONPATH` at the controller's own jax
  (kept for tests whose subject is not the install). `without_ensurepip` turns either
  into an Ubuntu image lacking python3-venv. Each image names itself to its sessions
  (`contract.EMULATED_IMAGE_ENV`), so a run's summary can say which one a node had.

Its SSH keys are `tpulab.emulator.hostkeys`; its processes (tags, holders, ports),
`tpulab.emulator.processes`.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tpulab.contract import EMULATED_IMAGE_ENV
from tpulab.emulator.bytecode import start_warming

__all__ = [
    "IMAGE_KINDS",
    "NETWORK_VARS",
    "BackendImage",
    "ImageEnv",
    "ImageKind",
    "bare_image_env",
    "default_cache_dir",
    "find_image_python",
    "find_interpreter",
    "image_env",
    "local_pythons",
    "preloaded_image_env",
    "session_env",
    "without_ensurepip",
]

log = logging.getLogger(__name__)


ImageKind = Literal["bare", "preloaded"]
IMAGE_KINDS: tuple[ImageKind, ...] = ("bare", "preloaded")

# TPU VM images ship Python 3.10 (Ubuntu 22.04); no older python can run the payloads.
IMAGE_PYTHON = (3, 10)


@dataclass(frozen=True)
class ImageEnv:
    """Environment variables of the emulated image, layered under HOME/USER per session.

    `path` and `pythonpath` are joined with ':'; `extra` is added verbatim. `name` is
    what the image calls itself to its sessions (and so in a run's summary).
    """

    path: tuple[str, ...]
    pythonpath: tuple[str, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)
    name: str = "custom"

    def as_env(self) -> dict[str, str]:
        env = {"PATH": ":".join(self.path), EMULATED_IMAGE_ENV: self.name}
        if self.pythonpath:
            env["PYTHONPATH"] = ":".join(self.pythonpath)
        env.update(self.extra)
        return env


def _site_dir_of(module: str) -> str | None:
    # find_spec locates the package without importing it (jax takes seconds to import).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))).resolve().parent)


def preloaded_image_env(*, cache_dir: Path | None = None) -> ImageEnv:
    """NOT like a real image: the running interpreter first on PATH (with uv beside it)
    and the site-packages holding jax and numpy on PYTHONPATH, so a venv made on the
    "VM" sees the controller's jax and the install is skipped. Named as such.

    Its jax is warm too: XLA's compiled programs persist in a cache every preloaded
    node shares (`cache_dir`, default `default_cache_dir()`), so the verifier's few
    small programs compile on the first emulated run only. A real VM compiles them
    on every run; what the programs compute is the same. On this machine a verifier
    run took 0.82 CPU-s cold and 0.64-0.69 warm (2026-12-06), about a third of it
    compiling: the largest share of an emulated run's VM-side CPU after `import jax`.
    """
    site_dirs: list[str] = []
    for module in ("jax", "jaxlib", "numpy"):
        site = _site_dir_of(module)
        if site is not None and site not in site_dirs:
            site_dirs.append(site)
    bin_dir = str(Path(sys.executable).parent)
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    return ImageEnv(
        path=(bin_dir, "/usr/bin", "/bin"),
        pythonpath=tuple(site_dirs),
        # The machine's trust and proxies, as the bare image keeps them: a session's
        # `--with` or `tpulab notebook` installs from the index here too.
        extra={**_network_env(), **_warm_jax(cache / "jax-compilation-cache")},
        name="preloaded (the controller's jax on PYTHONPATH)",
    )


def _warm_jax(directory: Path) -> dict[str, str]:
    """jax's persistent compilation cache in `directory`, for every program: by default
    jax keeps only those that took a second or more to compile (the verifier's take
    ~0.05 s each). Entries are keyed by the program, jax version and backend, so
    interpreters with different jax (the image's Python 3.10 venv) share it safely;
    a reader that meets a half-written entry warns and compiles (jax's own fallback).
    A directory that cannot be made leaves the image cold (jax would warn on every
    program of every run): only time is lost."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        log.warning("no jax compilation cache for the preloaded image: %s", error)
        return {}
    return {
        "JAX_COMPILATION_CACHE_DIR": str(directory),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


# -- the bare image --------------------------------------------------------------------

_VERSIONED = re.compile(r"python(3\.\d+)$")


def _pyenv_roots() -> list[str]:
    """Where pyenv may keep its interpreters: $PYENV_ROOT, the root of any pyenv
    directory on PATH (its shims or bin), and ~/.pyenv -- so they are found when HOME
    is not the home pyenv was installed in (a test's, a CI runner's)."""
    roots = [os.environ.get("PYENV_ROOT", "")]
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        path = Path(entry)
        if "pyenv" in entry and path.name in ("shims", "bin"):
            roots.append(str(path.parent))
    roots.append(str(Path.home() / ".pyenv"))
    return list(dict.fromkeys(root for root in roots if root))


def _candidate_interpreters() -> list[Path]:
    """Real (non-venv) CPython 3 interpreters on this machine: the system's and pyenv's.
    Not the controller's PATH, which may lead into a venv holding tpulab and jax, nor
    pyenv's shims, which run only the version pyenv has selected."""
    patterns = [
        "/usr/bin/python3.*",
        "/usr/local/bin/python3.*",
        *(f"{glob.escape(root)}/versions/*/bin/python3.*" for root in _pyenv_roots()),
    ]
    found: list[Path] = []
    for pattern in patterns:
        for name in sorted(glob.glob(pattern)):
            path = Path(name)
            if _VERSIONED.search(path.name) and os.access(path, os.X_OK):
                found.append(path)
    return found


@functools.cache
def _version_of(interpreter: Path) -> tuple[int, int, int] | None:
    try:
        done = subprocess.run(
            [str(interpreter), "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
    except OSError:
        return None
    parts = done.stdout.split()
    if done.returncode != 0 or len(parts) != 3:
        return None
    major, minor, micro = (int(p) for p in parts)
    return major, minor, micro


def _interpreters() -> dict[tuple[int, int], tuple[Path, str]]:
    """One working interpreter per minor version (the first found), with its version."""
    best: dict[tuple[int, int], tuple[Path, str]] = {}
    for path in _candidate_interpreters():
        version = _version_of(path)
        if version is None or version[:2] < IMAGE_PYTHON or version[:2] in best:
            continue
        best[version[:2]] = (path, ".".join(map(str, version)))
    return best


def find_image_python() -> tuple[Path, str]:
    """The image's python3: 3.10 (as on TPU VM images) where this machine has one, else
    the oldest >= 3.10 (logged, since then the image is newer than a real one)."""
    found = _interpreters()
    if not found:
        raise RuntimeError(
            "no CPython >= 3.10 found in /usr/bin, /usr/local/bin or pyenv for the "
            "emulated image's python3"
        )
    oldest = min(found)
    path, version = found[oldest]
    if oldest != IMAGE_PYTHON:
        log.warning(
            "no python3.10 on this machine: the emulated image's python3 is %s (%s), "
            "newer than a real TPU VM image's 3.10",
            version,
            path,
        )
    return path, version


def find_interpreter(version: str) -> Path | None:
    """A real CPython "3.X" (3.10 or newer) on this machine, or None."""
    major, minor = (int(part) for part in version.split("."))
    found = _interpreters().get((major, minor))
    return found[0] if found else None


def local_pythons() -> dict[str, Path]:
    """Interpreters newer than the image's, by "3.X": what a real VM's uv would download
    (uv's managed-Python download cannot run offline, so the bare image offers these)."""
    image = min(_interpreters(), default=IMAGE_PYTHON)
    return {f"{m}.{n}": p for (m, n), (p, _) in sorted(_interpreters().items()) if (m, n) > image}


def default_cache_dir() -> Path:
    """The package caches every emulated node shares (uv's and pip's own, both safe for
    concurrent installs), so a second run does not download jax again."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpulab" / "emulated-image"


def _link(directory: Path, name: str, target: Path) -> None:
    link = directory / name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


# On a real VM `sudo apt-get install python3-venv` is the last fallback; here it would
# change the emulator's own machine, so the image's sudo refuses (as with no sudo rights).
_SUDO = '#!/bin/sh\necho "sudo: the emulated image grants no sudo" >&2\nexit 1\n'


# Kept from the emulator's environment: the machine's certificate trust and proxies,
# which a real VM has configured for itself (a TLS-inspecting proxy needs its CA).
NETWORK_VARS = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "PIP_CERT",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
)


def _network_env() -> dict[str, str]:
    return {name: os.environ[name] for name in NETWORK_VARS if name in os.environ}


def bare_image_env(root: Path, *, cache_dir: Path | None = None) -> ImageEnv:
    """Like a real TPU VM image: `python3` of the image's version first on PATH, newer
    interpreters only under their versioned names (uv's managed pythons, offline), the
    system's tools, and no jax, no uv, no controller bin dir. `root` holds the image's
    bin directories; `cache_dir` (default `default_cache_dir()`) is shared by nodes."""
    python, version = find_image_python()
    image_bin = root / "image-bin"
    managed_bin = root / "uv-managed-pythons"
    image_bin.mkdir(parents=True, exist_ok=True)
    managed_bin.mkdir(parents=True, exist_ok=True)
    minor = ".".join(version.split(".")[:2])
    for name in ("python3", f"python{minor}"):
        _link(image_bin, name, python)
    _script(image_bin / "sudo", _SUDO)
    for stale in managed_bin.iterdir():
        stale.unlink()
    offered = local_pythons()
    for later, path in offered.items():
        _link(managed_bin, f"python{later}", path)
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    (cache / "uv").mkdir(parents=True, exist_ok=True)
    (cache / "pip").mkdir(parents=True, exist_ok=True)
    _warm_bytecode(cache, offered)
    log.info("bare emulated image: python3 %s (%s), caches in %s", version, python, cache)
    return ImageEnv(
        # The stand-ins for uv's managed pythons come before /usr/bin, as uv prefers
        # managed interpreters; /usr/bin has the machine's curl, tar (and maybe another
        # python3.X, findable by that name like a distribution package).
        path=(str(image_bin), str(managed_bin), "/usr/bin", "/bin"),
        extra={
            **_network_env(),
            "UV_CACHE_DIR": str(cache / "uv"),
            "PIP_CACHE_DIR": str(cache / "pip"),
            # A managed-Python download cannot succeed offline: fail at once, not after
            # a network timeout, when the request matches no local interpreter.
            "UV_PYTHON_DOWNLOADS": "never",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            # pip byte-compiles every installed module (about 1,100 files of jax, jaxlib
            # and numpy) where uv does not: time only, nothing a run can observe, and
            # the largest CPU cost of the test suite's bare-image installs.
            "PIP_NO_COMPILE": "1",
            # Resolve from the package index as a real VM does, not from this machine's
            # pip.conf mirrors or wheel directories.
            "PIP_CONFIG_FILE": os.devnull,
        },
        name=f"bare (python3 {version}, no jax, no uv)",
    )


def _warm_bytecode(cache: Path, offered: dict[str, Path]) -> None:
    """Bytecode for the venvs' Python in the shared uv cache (tpulab.emulator.bytecode):
    the bootstrap's default venv takes the newest interpreter the image `offered`."""
    if not offered:
        return
    version = max(offered, key=lambda text: tuple(int(part) for part in text.split(".")))
    tag = "cpython-" + version.replace(".", "")
    try:
        started = start_warming(cache, offered[version], tag)
    except OSError as error:  # only time is lost: never a reason to refuse a node
        log.warning("cannot compile the shared uv cache's packages: %s", error)
        return
    if started is not None:
        log.info("compiling the shared uv cache's packages for python %s", version)


_NO_ENSUREPIP = r"""#!/bin/sh
# Ubuntu's python3 without the python3-venv package: no ensurepip, so `-m venv` (with
# pip) refuses in Debian's words; `-m venv --without-pip` and everything else work.
if [ "$1" = -m ] && [ "$2" = ensurepip ]; then
  echo "/usr/bin/python3: No module named ensurepip" >&2; exit 1
fi
if [ "$1" = -m ] && [ "$2" = venv ]; then
  case " $* " in *" --without-pip "*) ;;
    *) printf '%s\n' \
         "The virtual environment was not created successfully because ensurepip is not" \
         "available.  On Debian/Ubuntu systems, you need to install the python3-venv" \
         "package using the following command." "" "    apt install python3.10-venv"
       exit 1 ;;
  esac
fi
exec "$TPULAB_IMAGE_PYTHON3" "$@"
"""


def without_ensurepip(image: ImageEnv, root: Path) -> ImageEnv:
    """`image` whose python3 lacks ensurepip, as Ubuntu without python3-venv (the
    emulator's `ensurepip_missing` fault)."""
    real = shutil.which("python3", path=":".join(image.path))
    if real is None:
        raise RuntimeError("the emulated image has no python3 to take ensurepip from")
    bin_dir = root / "no-ensurepip-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    _script(bin_dir / "python3", _NO_ENSUREPIP)
    return ImageEnv(
        path=(str(bin_dir), *image.path),
        pythonpath=image.pythonpath,
        extra={**image.extra, "TPULAB_IMAGE_PYTHON3": os.path.realpath(real)},
        name=f"{image.name}, without ensurepip",
    )


def image_env(kind: ImageKind, root: Path, *, cache_dir: Path | None = None) -> ImageEnv:
    """The named image: "bare" (like a real TPU VM) or "preloaded" (the controller's jax)."""
    if kind == "bare":
        return bare_image_env(root, cache_dir=cache_dir)
    if kind == "preloaded":
        return preloaded_image_env(cache_dir=cache_dir)
    raise ValueError(f"unknown emulated image {kind!r}; choose one of {IMAGE_KINDS}")


class BackendImage:
    """The image a host backend gives its nodes, and its per-node fault variants.

    `image` is a kind ("bare", the default, or "preloaded") or an explicit `ImageEnv`;
    `root` holds the image's bin directories (under the backend's state directory).
    """

    def __init__(
        self, image: ImageEnv | ImageKind, root: Path, *, cache_dir: Path | None = None
    ) -> None:
        self.root = root
        self.base = (
            image if isinstance(image, ImageEnv) else image_env(image, root, cache_dir=cache_dir)
        )
        self._no_ensurepip: ImageEnv | None = None

    def for_node(self, *, ensurepip_missing: bool = False) -> ImageEnv:
        if not ensurepip_missing:
            return self.base
        if self._no_ensurepip is None:
            self._no_ensurepip = without_ensurepip(self.base, self.root)
        return self._no_ensurepip


def session_env(image: ImageEnv, home: Path, user: str) -> dict[str, str]:
    """A clean login environment: nothing leaks in from the emulator's own environment."""
    env = {
        "HOME": str(home),
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
    }
    env.update(image.as_env())
    return env
