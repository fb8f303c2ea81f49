"""tpulab.remote.lines: a remote stream's bytes as the lines a terminal shows, a
progress bar redrawn with carriage returns included (its states passed on while it runs,
on a clock the test holds)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tpulab.remote.lines import LONGEST_SHOWN, LineSplitter, as_shown


def test_a_redrawn_line_shows_its_last_state_drawn() -> None:
    assert as_shown("\r 10%|#  | 1/10\r 20%|## | 2/10") == " 20%|## | 2/10"
    assert as_shown("done\r") == "done"  # a line ended "\r\n"
    assert as_shown("state\r\r") == "state"
    assert as_shown("\r") == ""
    assert as_shown("plain") == "plain"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _splitter(clock: Clock) -> tuple[LineSplitter, list[str]]:
    lines: list[str] = []
    splitter = LineSplitter(
        "stderr", lambda _stream, line: lines.append(line), redraw_every=10, clock=clock
    )
    return splitter, lines


def test_a_bar_that_runs_long_is_passed_on_every_interval_and_ends_once() -> None:
    clock = Clock()
    splitter, lines = _splitter(clock)
    splitter.feed(b"epoch 1\n")
    for step in range(1, 101):  # one state a second, each in its own read
        clock.now += 1
        splitter.feed(f"\r{step:3d}%|bar".encode())
    splitter.feed(b"\n")
    splitter.feed(b"", final=True)
    # Every 10 s the latest state (the one being drawn: as wide as the last), then the
    # end, not repeated.
    states = [f"{step:3d}%|bar" for step in range(10, 100, 10)]
    assert lines == ["epoch 1", *states, "100%|bar"]
    # A bar that ends on the state last passed on says it once.
    splitter.feed(b"\r1/2")
    clock.now += 10
    splitter.feed(b"\r2/2\r")
    splitter.feed(b"\n")
    assert lines[-2:] == ["100%|bar", "2/2"]


def test_a_state_cut_mid_write_is_not_shown_the_last_whole_one_is() -> None:
    clock = Clock()
    splitter, lines = _splitter(clock)
    splitter.feed(b"\r 10%|#    | 1/10")
    clock.now += 10
    splitter.feed(b"\r 20%|##   | 2")  # the rest of this state is still on its way
    splitter.feed(b"/10\n")
    assert lines == [" 10%|#    | 1/10", " 20%|##   | 2/10"]


def test_a_bar_quicker_than_the_interval_shows_only_its_end() -> None:
    clock = Clock()
    splitter, lines = _splitter(clock)
    splitter.feed(b"start\n")
    for step in range(5):
        clock.now += 0.1
        splitter.feed(f"\r{step}/5".encode())
    splitter.feed(b"\r5/5\n", final=True)
    assert lines == ["start", "5/5"]


def test_an_hour_long_bar_holds_only_its_last_states_and_the_text_stays_raw() -> None:
    clock = Clock()
    splitter, lines = _splitter(clock)
    raw = b"".join(b"\r%07d|" % step + b"#" * 60 for step in range(100_000))
    for at in range(0, len(raw), 4096):  # chunks that cut states (and bytes) anywhere
        splitter.feed(raw[at : at + 4096])
    held = splitter._pending  # the point: what is held, not all 6.7 MB
    assert sum(map(len, held)) < 200
    splitter.feed(b"", final=True)
    assert lines == [f"{99_999:07d}|" + "#" * 60]
    assert splitter.text == raw.decode()


def test_crlf_lines_and_a_multibyte_character_split_across_reads() -> None:
    clock = Clock()
    splitter, lines = _splitter(clock)
    data = "dos line\r\nbar \u2588\u2588\r\nend".encode()
    for byte in data:
        splitter.feed(bytes([byte]))
    splitter.feed(b"", final=True)
    assert lines == ["dos line", "bar \u2588\u2588", "end"]


@settings(max_examples=300, deadline=None)
@given(text=st.text(st.sampled_from("ab\n\r€ü")), cuts=st.lists(st.integers(0, 200)))
def test_streamed_output_is_split_into_the_same_lines_however_it_arrives(
    text: str, cuts: list[int]
) -> None:
    data = text.encode()  # "€" is 3 bytes: cuts land inside characters too
    lines: list[str] = []
    splitter = LineSplitter(
        "stdout", lambda _stream, line: lines.append(line), redraw_every=float("inf")
    )
    previous = 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        splitter.feed(data[previous:cut])
        previous = cut
    splitter.feed(b"", final=True)
    expected = text.split("\n")
    if expected[-1] == "":
        expected.pop()
    assert lines == [as_shown(line) for line in expected]
    assert splitter.text == text


def test_a_line_longer_than_a_screen_is_cut_saying_how_much_more_it_had() -> None:
    clock = Clock()
    splitter, lines = _splitter(clock)
    blob = b'{"losses": [' + b"0.125, " * 100_000 + b"0.1]}"  # one 700 KB line
    for at in range(0, len(blob), 32768):
        splitter.feed(blob[at : at + 32768])
    assert sum(map(len, splitter._pending)) <= LONGEST_SHOWN  # held: the head, no more
    splitter.feed(b"\nnext\n" + b"y" * (LONGEST_SHOWN + 5), final=True)
    more = len(blob) - LONGEST_SHOWN
    assert lines == [
        blob[:LONGEST_SHOWN].decode() + f" ... ({more:,} more characters not shown)",
        "next",
        "y" * LONGEST_SHOWN + " ... (5 more characters not shown)",
    ]
    assert splitter.text.encode() == blob + b"\nnext\n" + b"y" * (LONGEST_SHOWN + 5)
