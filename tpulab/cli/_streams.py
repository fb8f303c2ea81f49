"""Standard streams that a vanished reader cannot turn into a failed run.

`tpulab run ... | head -1` closes stdout after one line; Ctrl-C in `tpulab run | tee`
kills tee too; a closed terminal (SIGHUP) turns writes into EIO. Any of these used to
raise BrokenPipeError from a progress line inside the lifecycle, so a healthy run was
reported as a bug (exit 1) -- or, during a teardown, as the reason it failed. Output
nobody can read is not an error: once a stream's reader is gone its writes are dropped
(the file descriptor is pointed at /dev/null, so the interpreter's own flush at exit
cannot fail either), and the run finishes with its real exit status.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Any, TextIO

__all__ = ["install_forgiving_streams"]

# EPIPE: the reading end of a pipe is closed; EIO: the terminal went away (SIGHUP).
_READER_GONE = {errno.EPIPE, errno.EIO}


class ForgivingStream:
    """Wraps a text stream; after the reader is gone, accepts and drops every write."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner
        self.reader_gone = False

    def _gone(self) -> None:
        self.reader_gone = True
        # Later writes by code that holds the raw descriptor (and the final flush at
        # exit) land in /dev/null instead of raising again.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._inner.fileno())
            os.close(devnull)

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._inner.write(text)
            except OSError as error:
                if error.errno not in _READER_GONE:
                    raise
                self._gone()
        return len(text)

    def flush(self) -> None:
        if self.reader_gone:
            return
        try:
            self._inner.flush()
        except OSError as error:
            if error.errno not in _READER_GONE:
                raise
            self._gone()

    def isatty(self) -> bool:
        return not self.reader_gone and self._inner.isatty()

    def __getattr__(self, name: str) -> Any:
        # fileno, encoding, errors, buffer...: whatever rich and click ask of a stream.
        return getattr(self._inner, name)


def install_forgiving_streams() -> None:
    """Wrap sys.stdout and sys.stderr (once) for the rest of the process."""
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if current is not None and not isinstance(current, ForgivingStream):
            setattr(sys, name, ForgivingStream(current))
