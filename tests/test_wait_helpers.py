"""The suite's shared waits (tests/helpers.py) do what the race-prone checks they
replaced did not: a file that exists but is not yet written is waited for, a wait that
times out says what it waited for, and a refused port stays refused while held."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from helpers import refused_port, wait_until, written_text


def test_written_text_waits_for_the_line_not_for_the_file(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    pid_file.touch()  # what `echo $! > F` leaves between creating F and writing to it
    assert pid_file.read_text() == ""  # "it exists" is not "it is written"
    writer = threading.Timer(0.3, pid_file.write_text, ("4242\n",))
    writer.start()
    try:
        assert written_text(pid_file) == "4242\n"
    finally:
        writer.join()


def test_wait_until_returns_when_it_came_true_and_names_what_timed_out() -> None:
    ready_at = time.monotonic() + 0.2
    seen = wait_until(lambda: time.monotonic() >= ready_at, "the moment")
    assert seen >= ready_at
    with pytest.raises(AssertionError, match=r"after 0\.1 s waiting for a thing that never"):
        wait_until(lambda: False, "a thing that never comes", timeout=0.1)


def test_a_refused_port_refuses_and_no_one_else_can_take_it() -> None:
    with refused_port() as port:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
