"""Bytecode in the bare image's shared uv cache, so an emulated node's `import jax` does
not compile jax from source. Stdlib only: also run as a script by the venvs' Python,

    python bytecode.py ARCHIVE_DIR MARKER_DIR

Every emulated node installs jax into a fresh venv, which uv fills by hard-linking the
unpacked wheels of its cache (`<cache>/uv/archive-v0/<id>/`). None holds bytecode, so
each node's first `import jax` compiled about 600 modules of jax alone: 1.8 CPU-s for
the import against 0.55 s with bytecode (Python 3.13, jax 0.12.0.1, measured
2026-12-06), paid by every emulated verifier process (four per v5litepod-16). A real VM
pays that once per VM too; the emulator, whose nodes share one cache, pays it once per
cache. uv links an archive's `__pycache__` files along with its sources, and their
timestamps stay valid since a hard link shares the source's mtime.

`start_warming` spawns this script (detached, niced, quiet) when an archive lacks the
marker of the Python a venv will use; the script takes a lock (another process already
warming: it leaves), compiles each unmarked archive, and marks it in MARKER_DIR, outside
the archives so that uv never links a marker into a venv. Writes are atomic (compileall's
own), so a venv linked mid-way gets a mix of compiled and not-yet-compiled modules, each
valid. Only time changes: what a run can observe of a node is the same either way.
"""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["marker_name", "start_warming", "unmarked_archives"]

SCRIPT = Path(__file__)


def marker_name(archive: str, cache_tag: str) -> str:
    """The marker of `archive` compiled for `cache_tag` (sys.implementation.cache_tag,
    e.g. "cpython-313": the tag in the names of the .pyc files)."""
    return f"{archive}.{cache_tag}"


def unmarked_archives(archives: Path, markers: Path, cache_tag: str) -> list[str]:
    """The archive ids of uv's cache without bytecode for `cache_tag` yet."""
    try:
        found = sorted(entry.name for entry in os.scandir(archives) if entry.is_dir())
    except OSError:  # no cache yet: nothing to warm
        return []
    return [name for name in found if not (markers / marker_name(name, cache_tag)).exists()]


def start_warming(cache_dir: Path, python: Path, cache_tag: str) -> subprocess.Popen[bytes] | None:
    """Compile what `python` (whose tag is `cache_tag`) will import from the uv cache under
    `cache_dir`, in the background; None when every archive is marked already. The
    process outlives its caller if it must (a `tpulab run --emulate` ends first)."""
    archives = cache_dir / "uv" / "archive-v0"
    markers = cache_dir / "bytecode"
    if not unmarked_archives(archives, markers, cache_tag):
        return None
    markers.mkdir(parents=True, exist_ok=True)
    nice = ["nice", "-n", "10"] if os.path.exists("/usr/bin/nice") else []
    process = subprocess.Popen(
        [*nice, str(python), "-I", str(SCRIPT), str(archives), str(markers)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C of the run is not this process's business
    )
    # Reaped while the caller lives; if it exits first, init reaps it.
    threading.Thread(target=process.wait, name="bytecode-reaper", daemon=True).start()
    return process


def warm(archives: Path, markers: Path) -> list[str]:
    """Compile every unmarked archive for this interpreter and mark it; the archives
    compiled. Returns at once, compiling nothing, while another process holds the lock."""
    tag = sys.implementation.cache_tag
    with open(markers / "lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []
        done = []
        for name in unmarked_archives(archives, markers, tag):
            # quiet=2: a module that is not valid for this Python (a test file written
            # for another version) stays uncompiled, as its import would fail anyway.
            compileall.compile_dir(archives / name, quiet=2, workers=1)
            with contextlib.suppress(OSError):
                (markers / marker_name(name, tag)).touch()
            done.append(name)
        return done


if __name__ == "__main__":
    warm(Path(sys.argv[1]), Path(sys.argv[2]))
