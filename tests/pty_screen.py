"""A real pseudo-terminal for CLI tests, and just enough of a terminal to read its screen.

`spawn(args)` starts `python -m tpulab ARGS` as a session leader whose controlling
terminal is a new pty, so bytes the test writes are keystrokes: b"\\x03" is a real Ctrl-C
(the line discipline sends SIGINT to the foreground group and echoes "^C", as a user's
terminal does). `Screen` applies what rich's live display sends -- carriage return,
newline, erase line, cursor up, hide/show cursor, colours -- so a test asserts on the
lines a user would see, not on the raw byte stream. `answer_prompts(args, answers)` is
the simpler case: the CLI on a pty as stdin/stdout/stderr, its [y/N] prompts answered in
order.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["PtyRun", "Screen", "answer_prompts", "spawn"]

_ESCAPE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


@dataclass
class Screen:
    """The lines a terminal shows after `text` (no wrapping: the pty is wide enough)."""

    lines: list[str] = field(default_factory=lambda: [""])
    row: int = 0
    col: int = 0

    @classmethod
    def of(cls, raw: bytes) -> Screen:
        screen = cls()
        screen.feed(raw.decode(errors="replace"))
        return screen

    def feed(self, text: str) -> None:
        at = 0
        while at < len(text):
            escape = _ESCAPE.match(text, at)
            if escape is not None:
                self._control(escape.group(1), escape.group(2))
                at = escape.end()
            elif text[at] == "\x1b":  # another escape (ESC 7, ...): nothing a test reads
                at += 2
            else:
                self._char(text[at])
                at += 1

    def _char(self, char: str) -> None:
        if char == "\r":
            self.col = 0
        elif char == "\n":
            self.row += 1
            if self.row == len(self.lines):
                self.lines.append("")
        elif char == "\b":
            self.col = max(0, self.col - 1)
        elif char >= " ":
            line = self.lines[self.row].ljust(self.col)
            self.lines[self.row] = line[: self.col] + char + line[self.col + 1 :]
            self.col += 1

    def _control(self, params: str, command: str) -> None:
        count = int(params) if params.isdigit() else 1
        if command == "K":  # erase in line (2: all of it; 0 or none: to its end)
            line = self.lines[self.row]
            self.lines[self.row] = "" if params == "2" else line[: self.col]
        elif command == "A":
            self.row = max(0, self.row - count)
        elif command == "B":
            self.row = min(len(self.lines) - 1, self.row + count)
        elif command == "G":
            self.col = count - 1
        elif command == "D":
            self.col = max(0, self.col - count)
        # "m" (colours) and "h"/"l" (cursor visibility) change nothing a test reads.

    def text(self) -> list[str]:
        return [line.rstrip() for line in self.lines]


@dataclass
class PtyRun:
    process: subprocess.Popen[bytes]
    controller: int
    raw: bytearray = field(default_factory=bytearray)

    @property
    def screen(self) -> list[str]:
        """What the terminal shows now, line by line."""
        return Screen.of(bytes(self.raw)).text()

    def read_until(self, wanted: Callable[[PtyRun], bool], timeout: float) -> bool:
        """Read the terminal until `wanted(self)` or the child closed it or `timeout`."""
        deadline = time.monotonic() + timeout
        while not wanted(self):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.controller], [], [], min(left, 0.1))
            if ready and not self._read():
                return wanted(self)
        return True

    def _read(self) -> bool:
        try:
            chunk = os.read(self.controller, 65536)
        except OSError:  # EIO: every process holding the terminal has closed it
            return False
        if not chunk:
            return False
        self.raw.extend(chunk)
        return True

    def shows(self, text: str) -> bool:
        return text in bytes(self.raw).decode(errors="replace")

    def press(self, keys: bytes) -> None:
        os.write(self.controller, keys)

    def finish(self, timeout: float) -> int:
        """Read everything until the child exits; its exit status."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.controller], [], [], 0.1)
            if ready and not self._read():
                break
        status = self.process.wait(timeout=max(1.0, deadline - time.monotonic()))
        while self._drain():
            pass
        os.close(self.controller)
        return status

    def _drain(self) -> bool:
        ready, _, _ = select.select([self.controller], [], [], 0.05)
        return bool(ready) and self._read()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def _take_terminal() -> None:  # in the child, before exec: the pty becomes its terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def spawn(args: list[str], env: Mapping[str, str] | None = None, columns: int = 200) -> PtyRun:
    controller, terminal = os.openpty()
    # A wide terminal, so the screen model never has to wrap.
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "tpulab", *args],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
        preexec_fn=_take_terminal,  # one ioctl: safe in a threaded parent
        env={**os.environ, "TERM": "xterm-256color", **(env or {})},
    )
    os.close(terminal)
    return PtyRun(process, controller)


def answer_prompts(args: list[str], answers: list[str]) -> tuple[int, str]:
    """Run `python -m tpulab ARGS` on a pseudo-terminal, answer its [y/N] prompts in
    order, and return (exit status, everything it wrote)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "tpulab", *args],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "COLUMNS": "200"},
        close_fds=True,
    )
    os.close(terminal)
    seen = b""
    pending = list(answers)
    deadline = time.monotonic() + 180  # a bound; a teardown under load takes tens of s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            if pending and seen.count(b"[y/N]") > len(answers) - len(pending):
                os.write(controller, pending.pop(0).encode() + b"\r")
        elif process.poll() is not None:
            break
    status = process.wait(timeout=30)
    os.close(controller)
    return status, seen.decode(errors="replace")
