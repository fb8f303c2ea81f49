"""What `tpulab run` prints per phase when its output is not a terminal (a pipe, a log)."""

from __future__ import annotations

import io
import signal

from rich.console import Console

from tpulab import errors as E
from tpulab.cli._run_display import RunDisplay
from tpulab.run.progress import Phase
from tpulab.run.signals import SignalInterrupt


def _display() -> tuple[RunDisplay, io.StringIO]:
    out = io.StringIO()
    display = RunDisplay(verbose=False, quiet=False)
    display.console = Console(file=out, force_terminal=False, highlight=False, width=200)
    return display, out


def test_off_a_terminal_each_phase_is_one_line() -> None:
    display, out = _display()
    display.phase_started(Phase.CREATE)
    display.phase_finished(Phase.CREATE, 1.4, "node n")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "Create TPU VM" in lines[0]
    assert "node n" in lines[0]


def test_a_phase_stopped_by_a_signal_says_so_in_words() -> None:
    display, out = _display()
    display.phase_started(Phase.EXECUTE)
    display.phase_failed(Phase.EXECUTE, 2.0, SignalInterrupt(signal.SIGTERM))
    display.phase_started(Phase.COLLECT)
    display.phase_failed(Phase.COLLECT, 0.1, KeyboardInterrupt())
    display.phase_started(Phase.VERIFY)
    display.phase_failed(Phase.VERIFY, 0.1, E.VerificationError("bad sums", []))
    text = out.getvalue()
    assert "SignalInterrupt" not in text
    assert "interrupted by SIGTERM" in text
    assert "interrupted by SIGINT" in text
    assert "bad sums" in text


def test_all_output_names_each_workers_lines_and_quiet_hides_them() -> None:
    from tpulab.run.progress import COMMAND_STREAM, worker_command_stream

    display, out = _display()
    display.remote_output(COMMAND_STREAM, "step 1")
    display.remote_output(worker_command_stream(3), "loss 0.5")
    display.remote_output(worker_command_stream(12), "loss 0.4")
    assert out.getvalue().splitlines() == ["  cmd ┃ step 1", "   w3 ┃ loss 0.5", "  w12 ┃ loss 0.4"]
    display.command_quiet = True
    display.remote_output(worker_command_stream(3), "hidden")
    assert "hidden" not in out.getvalue()


def test_a_commands_escape_codes_are_styles_on_a_terminal_and_gone_off_one() -> None:
    from tpulab.run.progress import COMMAND_STREAM

    lines = ["\x1b[31mred\x1b[0m normal", "\x1b[2K\x1b[1Aafter cursor codes"]
    display, out = _display()
    display.verbose = True
    for line in lines:
        display.remote_output(COMMAND_STREAM, line)
        display.remote_output("stderr", line)  # tpulab's own commands, under -v
    assert out.getvalue().splitlines() == [
        "  cmd ┃ red normal",
        "  │ red normal",
        "  cmd ┃ after cursor codes",
        "  │ after cursor codes",
    ]
    terminal = io.StringIO()
    display.console = Console(
        file=terminal, force_terminal=True, color_system="standard", highlight=False, width=200
    )
    for line in lines:
        display.remote_output(COMMAND_STREAM, line)
    shown = terminal.getvalue()
    assert "\x1b[31mred\x1b[0m normal" in shown  # the colour kept
    assert "\x1b[1A" not in shown  # the cursor left where tpulab's lines need it
    assert "\x1b[2K" not in shown


def test_off_a_terminal_command_lines_are_what_rich_would_print() -> None:
    """Off a terminal without colour the command's lines skip Console.print (its cost
    per line held a chatty command's output back); what they say must not change:
    each is compared with rich's own rendering of it, on tpulab's console settings."""
    from rich.text import Text

    from tpulab.cli._run_display import _as_text
    from tpulab.run.progress import COMMAND_STREAM, worker_command_stream

    lines = [
        "plain",
        "tab\there\tand\tthere",
        "\x1b[31mred\x1b[0m text",
        "bell\x07 and \r carriage",
        "wide 中文字 ok, emoji 🎉",
        "trailing   ",
        "",
        "\x1b[2K\x1b[1A cursor codes",
        "\x1b]0;a title\x07 after an OSC",
        "vt\x0bff\x0c",
        "y" * 500,  # longer than any terminal: kept whole (soft wrap)
    ]
    fast, by_rich = io.StringIO(), io.StringIO()
    display = RunDisplay(verbose=False, quiet=False)
    display.console = Console(file=fast, highlight=False, soft_wrap=True)
    assert display.console.color_system is None  # the path under test
    reference = Console(file=by_rich, highlight=False, soft_wrap=True)
    for stream, gutter in ((COMMAND_STREAM, "  cmd ┃ "), (worker_command_stream(2), "   w2 ┃ ")):
        for line in lines:
            display.remote_output(stream, line)
            reference.print(Text.assemble((gutter, "bold blue"), _as_text(line)))
    assert fast.getvalue() == by_rich.getvalue()
    assert len(fast.getvalue().splitlines()) == 2 * len(lines)
