"""The laptop paths a user names, proven usable before anything is created.

Every path flag (--workdir, --requirements, --out; a project file's `requirements` and a
requirements file's references) is resolved here, so a symlink loop, a name too long
for the filesystem or a component that is a file is a ConfigError (exit 2) naming the
flag, instead of Python 3.11's `RuntimeError: Symlink loop` or an OSError from deep in
the run. `--out` is more than resolved: `prove_creatable` really creates it (and a file
in it), then removes what it made, so a run whose artifacts could not land is refused
before its VM is billed, and a refused run leaves no directory behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from tpulab.errors import ConfigError

__all__ = ["check_utf8", "prove_creatable", "resolve_local"]

# stat() errors that only say "not there (yet)": the caller decides what that means.
_ABSENT = (errno.ENOENT, errno.ENOTDIR)


def resolve_local(path: Path, flag: str, *, hint: str) -> Path:
    """`path` made absolute with its links followed; ConfigError naming `flag` when it
    cannot be (a link loop, a name too long, a directory that cannot be searched)."""
    try:
        resolved = path.resolve()
        os.stat(resolved)
    except RuntimeError:  # Python 3.11's resolve() on a loop ("Symlink loop from ...")
        raise _loop(path, flag, hint) from None
    except OSError as error:
        if error.errno in _ABSENT:
            return resolved
        if error.errno == errno.ELOOP:  # resolve() on 3.13+ leaves the loop to stat()
            raise _loop(path, flag, hint) from None
        where = "" if str(error.filename or path) == str(path) else f" ({error.filename})"
        raise ConfigError(f"{flag} {path}: {error.strerror or error}{where}.", hint=hint) from None
    return resolved


def _loop(path: Path, flag: str, hint: str) -> ConfigError:
    return ConfigError(
        f"{flag} {path} goes through a symbolic link loop: it names nothing.",
        hint=f"Fix or remove the link (`ls -l` shows where each points). {hint}",
    )


def check_utf8(path: Path, flag: str, *, hint: str) -> None:
    """ConfigError when `path` is not UTF-8: tpulab records it (run.json, the journal's
    pointer to it) as text that must lead back to exactly this directory."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise ConfigError(f"{flag} {shown} is not a UTF-8 path.", hint=hint) from None


def prove_creatable(path: Path, flag: str, *, hint: str) -> None:
    """Create the directory `path` (and its missing parents) and a file in it, then
    remove every one of them: ConfigError naming `flag` when the filesystem refuses
    (a parent that is a file, a read-only or pseudo filesystem, no permission, a name
    too long). A directory that already exists is only written to and left as it was."""
    made: list[Path] = []
    try:
        missing: list[Path] = []
        at = path
        while not os.path.lexists(at) and at != at.parent:
            missing.append(at)
            at = at.parent
        if not at.is_dir():  # a file, or a link to one or to nothing, where a directory goes
            raise ConfigError(
                f"{flag} {path} cannot be created: {at} is not a directory.", hint=hint
            )
        for directory in reversed(missing):
            directory.mkdir()
            made.append(directory)
        handle, probe = tempfile.mkstemp(prefix=".tpulab-probe-", dir=path)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        where = "" if str(error.filename or path) == str(path) else f" ({error.filename})"
        raise ConfigError(
            f"{flag} {path} cannot be written: {error.strerror or error}{where}.", hint=hint
        ) from None
    finally:
        for directory in reversed(made):
            # Not empty: something else wrote into it meanwhile, so it is no longer ours.
            with contextlib.suppress(OSError):
                directory.rmdir()
