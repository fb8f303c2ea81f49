"""How `tpulab run` draws its progress: one line per phase, a spinner and elapsed time.

A RunObserver (tpulab.run.progress) fed by the lifecycle; with --json every line goes to
stderr so that stdout carries only the envelope.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpulab import errors as E
from tpulab.cli._console import console, print_stderr

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live
    from rich.text import Text

    from tpulab.run.progress import Phase

__all__ = ["RunDisplay"]


class RunDisplay:
    """Draws the run's progress (a RunObserver): a live spinner on a terminal, one plain
    line per phase otherwise; remote output only with -v."""

    def __init__(
        self,
        *,
        verbose: bool,
        quiet: bool,
        command_quiet: bool = False,
        stderr: bool | None = None,
    ) -> None:
        self.quiet = quiet
        self.verbose = verbose
        # --quiet: the user's command's output only goes to its log on the VM (fetched).
        self.command_quiet = command_quiet
        # With --json stdout carries only the envelope; everything else goes to stderr
        # (`stderr=True`: the progress too, as `up --json` shows it).
        self.console = console(stderr=quiet if stderr is None else stderr)
        self._live: Live | None = None
        self._current: tuple[Phase, float] | None = None

    def __rich__(self) -> RenderableType:
        import time

        from rich.spinner import Spinner

        if self._current is None:
            return ""
        phase, started = self._current
        return Spinner("dots", text=f"{phase.label}  {time.monotonic() - started:5.1f}s")

    def _print(self, text: object) -> None:
        if self._live is not None:
            self._live.console.print(text)
        else:
            self.console.print(text)

    def phase_started(self, phase: Phase) -> None:
        import time

        self._current = (phase, time.monotonic())
        if self.quiet:
            return
        # Off a terminal (a pipe, a log file) there is no spinner and no start line: the
        # phase's one line, with its duration and result, is printed when it ends.
        if self.console.is_terminal and self._live is None:
            from rich.live import Live

            live = Live(self, console=self.console, refresh_per_second=10, transient=True)
            live.start()
            self._live = live

    def _done(self, phase: Phase, seconds: float, mark: str, detail: str) -> None:
        from rich.markup import escape

        # The spinner lives only while a phase runs; stopping it before printing the
        # phase's line keeps a transient live area from ever overwriting that line.
        self.stop()
        self._current = None
        if not self.quiet:
            self.console.print(f"{mark} {phase.label:<24} {seconds:6.1f}s  {escape(detail)}")

    def phase_finished(self, phase: Phase, seconds: float, detail: str) -> None:
        self._done(phase, seconds, "[green]✓[/]", detail)

    def phase_failed(self, phase: Phase, seconds: float, error: BaseException) -> None:
        message = _why(error)
        self._done(phase, seconds, "[red]✗[/]", message)

    def remote_output(self, stream: str, line: str) -> None:
        from rich.text import Text

        from tpulab.run.progress import COMMAND_STREAM, command_stream_worker

        worker = command_stream_worker(stream)
        if stream == COMMAND_STREAM or worker is not None:
            # The user's own output: always shown live (on stderr with --json), set
            # apart from tpulab's lines by a gutter of its own and no dimming; under
            # --all-output the gutter names the slice worker that printed it.
            gutter = "  cmd ┃ " if worker is None else f"{f'w{worker}':>5} ┃ "
            if not self.command_quiet:
                self._print_command_line(Text.assemble((gutter, "bold blue"), _as_text(line)))
            return
        if self.verbose:
            style = "dim" if stream == "stdout" else "dim yellow"
            self._print(Text.assemble("  │ ", _as_text(line), style=style))

    def _print_command_line(self, text: Text) -> None:
        """One line of the command's output. With no spinner and no colour (a pipe, a
        log file) it is written as rich would print it (soft-wrapped: whole; its tabs
        expanded) but without Console.print, which renders each line afresh: ~160 us a
        line, so a chatty command outran this end at ~6,000 lines a second and the rest
        of its output went only to its log (tests/benchmarks/bench_output.py)."""
        console = self.console
        if self._live is not None or console.color_system is not None or not console.soft_wrap:
            self._print(text)
            return
        text.expand_tabs(console.tab_size)
        out = console.file
        out.write(text.plain + "\n")
        out.flush()  # a log being tailed gets each line as it comes, as rich's print does

    def note(self, message: str) -> None:
        from rich.text import Text

        if not self.quiet:
            self._print(Text(f"  · {message}", style="dim"))

    def alert(self, markup: str) -> None:
        """A message that must be read whole, e.g. "SIGINT ignored: ..." (the signal
        guard's `notify`). While the spinner is up, the live display prints it: it first
        erases the spinner's line -- and the "^C" the terminal echoed onto it -- then
        prints the message on its own line and redraws the spinner below. Written to
        stderr directly, it would land after the spinner's text on the same line."""
        live = self._live
        if live is None:
            print_stderr(markup)
            return
        from rich.text import Text

        live.console.print(Text.from_markup(markup))

    def milestone(self, name: str, at: float) -> None:
        pass

    def stop(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.stop()


def _as_text(line: str) -> Text:
    """A line the VM printed, for rich: its colour codes as styles (shown on a terminal,
    dropped off one, as rich does for tpulab's own), every other escape sequence left
    out, so a command's cursor movement ("\\x1b[1A") cannot redraw tpulab's lines."""
    from rich.text import Text

    return Text.from_ansi(line) if "\x1b" in line else Text(line)


def _why(error: BaseException) -> str:
    """What stopped a phase, in words: a signal reads "interrupted by SIGTERM", not the
    name of the exception class that carries it."""
    if isinstance(error, E.TpuLabError):
        return error.message
    if isinstance(error, KeyboardInterrupt):
        return "interrupted by SIGINT (Ctrl-C)"
    return str(error) or type(error).__name__
