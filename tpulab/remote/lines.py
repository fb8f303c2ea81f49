"""A remote stream's bytes as the lines a terminal would show.

The VM's output reaches us as chunks; `LineSplitter` keeps the text whole (raw, for
results and error tails) and passes each line to `on_line` as it ends. A line its writer
redraws with carriage returns (a progress bar: tqdm, a download) is shown as a terminal
shows it, its last state, not every state run together; and while it is being redrawn,
its latest state is passed on as a line of its own every `REDRAW_EVERY` seconds, so a
bar that runs for an hour without a newline still says how far it got. A line longer
than `LONGEST_SHOWN` is passed on cut, saying how much more it had.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable

__all__ = ["LONGEST_SHOWN", "REDRAW_EVERY", "LineSplitter", "as_shown"]

# The most of one line that is passed on: about 140 rows of a 120-column terminal. A
# longer one is cut there, saying how much more it had.
LONGEST_SHOWN = 16 * 1024

# How often a line being redrawn is passed on in the meantime (as allennlp's tqdm does
# off a terminal): often enough to see progress, seldom enough not to flood a log.
REDRAW_EVERY = 10.0


def as_shown(line: str) -> str:
    """What a terminal shows of a line its writer redrew with carriage returns (a
    progress bar, "\\r 10%|#  | 1/10\\r 20%|## | 2/10"): the last state drawn, not every
    state run together into one long line. (A terminal would also leave the tail of a
    longer earlier state behind a shorter one; progress bars pad, so none is lost.)"""
    if "\r" not in line:
        return line
    drawn = [state for state in line.split("\r") if state]
    return drawn[-1] if drawn else ""


class LineSplitter:
    """One stream's bytes -> its text (kept whole, raw) and its lines as a terminal
    shows them (`as_shown`), each passed to `on_line` as it ends; a line being redrawn
    passes its latest state every `redraw_every` seconds meanwhile."""

    def __init__(
        self,
        stream: str,
        on_line: Callable[[str, str], None] | None,
        *,
        redraw_every: float = REDRAW_EVERY,
        longest: int = LONGEST_SHOWN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._on_line = on_line
        self._redraw_every = redraw_every
        self._clock = clock
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending: list[str] = []  # pieces of an unfinished line (a list: no O(n^2))
        self._held = 0  # characters in _pending
        self._cut = 0  # characters of the unfinished line past `longest`, not held
        self._longest = longest
        self._parts: list[str] = []
        self._passed_at = clock()  # when a line or a state was last passed on
        self._state_passed: str | None = None  # the unfinished line's state passed on

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        self._parts.append(text)
        if self._on_line is None:
            return
        *complete, rest = text.split("\n")
        lines = [self._finish(piece) for piece in complete]
        state = self._hold(rest)
        if final and (self._pending or self._cut):
            lines.append(self._finish(""))
        for line in lines:
            self._pass(line, finished=True)
        if state and not final and self._clock() - self._passed_at >= self._redraw_every:
            self._pass(state, finished=False)

    def _hold(self, piece: str) -> str | None:
        """Add `piece` to the unfinished line; the state to show of it if it is being
        redrawn (None: it is not)."""
        state = None
        if "\r" in piece:
            # A bar redrawn for an hour without a newline: only its last state drawn
            # (and the one being drawn) can still be shown, so only they are held.
            *drawn, drawing = ("".join(self._pending) + piece).split("\r")
            last = next((each for each in reversed(drawn) if each), "")
            self._pending, self._held = [f"{last}\r{drawing}"], len(last) + 1 + len(drawing)
            # The state being drawn may be cut mid-write; bars keep their width, so one
            # as long as the last state is whole (a bar redrawn each minute is shown
            # as it is, not a minute late).
            state = drawing if len(drawing) >= len(last) else last
        elif piece:
            self._pending.append(piece)
            self._held += len(piece)
        if self._held > self._longest:
            # A line longer than a screen can show (a JSON blob printed whole): its head
            # is shown, and how much more there was; the log has all of it.
            held = "".join(self._pending)
            self._cut += len(held) - self._longest
            self._pending, self._held = [held[: self._longest]], self._longest
        return state[: self._longest] if state else None

    def _finish(self, piece: str) -> str:
        """The unfinished line ended by `piece` (the text before its newline)."""
        self._hold(piece)
        line = as_shown("".join(self._pending))
        if self._cut:
            line += f" ... ({self._cut:,} more characters not shown)"
        self._pending, self._held, self._cut = [], 0, 0
        return line

    def _pass(self, line: str, *, finished: bool) -> None:
        assert self._on_line is not None
        already = self._state_passed
        self._state_passed = None if finished else line
        self._passed_at = self._clock()
        if line != already:  # a bar that ends on the state last passed: said once
            self._on_line(self._stream, line)
