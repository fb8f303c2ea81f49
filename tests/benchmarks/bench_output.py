"""What showing one line of the user's command costs `tpulab run` off a terminal (a pipe,
a log file): RunDisplay's line against rich's Console.print of the same line (the way
every line went before), measured in the same run on the same console settings.

A chatty command's lines reach the laptop only as fast as this end shows them; past the
launcher's buffer the rest go to output.log alone ("N lines not streamed"). Goal: at
least 5x cheaper than Console.print. Run: `pytest tests/benchmarks/bench_output.py -s`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.text import Text

from benchmarks.smoke import goal, rounds
from tpulab.cli._run_display import RunDisplay, _as_text
from tpulab.run.progress import COMMAND_STREAM

LINES = 5_000
LINE = "step 1234 | loss 0.12345 | tokens/s 98765.4 | " + "x" * 50


def _per_line(show: Callable[[], None]) -> float:
    samples = []
    for _ in range(rounds(5)):
        started = time.perf_counter()
        for _ in range(LINES):
            show()
        samples.append((time.perf_counter() - started) / LINES)
    return statistics.median(samples)


def test_a_command_line_off_a_terminal(tmp_path: Path) -> None:
    with (tmp_path / "shown.log").open("w") as shown, (tmp_path / "rich.log").open("w") as by_rich:
        display = RunDisplay(verbose=False, quiet=False)
        display.console = Console(file=shown, highlight=False, soft_wrap=True)
        reference = Console(file=by_rich, highlight=False, soft_wrap=True)

        ours = _per_line(lambda: display.remote_output(COMMAND_STREAM, LINE))
        rich = _per_line(
            lambda: reference.print(Text.assemble(("  cmd ┃ ", "bold blue"), _as_text(LINE)))
        )
    # The same text either way (test_run_display pins it line by line).
    assert (tmp_path / "shown.log").read_text() == (tmp_path / "rich.log").read_text()
    print(
        f"\ncommand line off a terminal: {ours * 1e6:.1f} us "
        f"(rich's Console.print {rich * 1e6:.1f} us, x{rich / ours:.1f}); "
        f"{1 / ours:,.0f} lines/s vs {1 / rich:,.0f}"
    )
    goal(rich / ours >= 5, f"a command line costs {ours * 1e6:.1f} us, rich {rich * 1e6:.1f} us")
