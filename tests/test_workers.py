"""tpulab.run.workers.fan_out: a slice's steps on every worker at once, failing fast."""

from __future__ import annotations

import threading

import pytest

from tpulab.errors import CommandFailedError, RemoteError
from tpulab.run.workers import fan_out, name_worker


def test_results_come_back_in_worker_order_whatever_order_they_finish_in() -> None:
    # Worker 0 finishes last: it waits until every other worker has finished.
    others_done = threading.Barrier(4)
    finished: list[int] = []

    def step(worker: int) -> str:
        if worker == 0:
            others_done.wait(timeout=10)
        else:
            finished.append(worker)
            others_done.wait(timeout=10)
        return f"w{worker}"

    done = fan_out(range(4), step, what="test")
    assert done.results == ["w0", "w1", "w2", "w3"]
    assert len(done.seconds) == 4
    assert done.describe().startswith("4/4 workers, slowest worker ")


def test_the_first_failure_is_raised_at_once_naming_its_worker() -> None:
    # Worker 2 fails while worker 0 is still running (blocked until the test releases it):
    # the fan-out must not wait for worker 0 to report the failure.
    release = threading.Event()
    zero_finished = threading.Event()

    def step(worker: int) -> int:
        if worker == 2:
            raise CommandFailedError("exited 1", exit_status=1)
        if worker == 0:
            release.wait(timeout=5)
            zero_finished.set()
        return worker

    try:
        with pytest.raises(CommandFailedError) as raised:
            fan_out(range(3), step, what="test")
        assert not zero_finished.is_set()  # raised while worker 0 still ran
    finally:
        release.set()
    assert raised.value.message == "worker 2: exited 1"
    assert raised.value.exit_status == 1  # same error, same type, same attributes
    assert str(raised.value) == "worker 2: exited 1"


def test_one_worker_runs_inline_and_its_errors_read_as_before() -> None:
    caller = threading.get_ident()
    seen: list[int] = []

    def step(worker: int) -> None:
        seen.append(threading.get_ident())
        raise RemoteError("no route")

    with pytest.raises(RemoteError) as raised:
        fan_out([0], step, what="test")
    assert seen == [caller]
    assert raised.value.message == "no route"


def test_one_at_a_time_runs_in_worker_order_on_the_callers_thread() -> None:
    caller = threading.get_ident()
    order: list[tuple[int, int]] = []

    def step(worker: int) -> int:
        order.append((worker, threading.get_ident()))
        if worker == 1:
            raise RemoteError("refused")
        return worker

    with pytest.raises(RemoteError, match=r"^worker 1: refused$"):
        fan_out(range(3), step, what="test", max_parallel=1)
    assert order == [(0, caller), (1, caller)]  # stopped at the first failure


def test_progress_counts_workers_done() -> None:
    said: list[str] = []
    fan_out(range(3), lambda w: w, what="bootstrap", progress=said.append)
    assert said == [f"bootstrap: {n}/3 workers done" for n in (1, 2, 3)]


def test_a_worker_is_named_once_and_only_on_a_slice() -> None:
    error = RemoteError("worker 3: already named")
    assert name_worker(error, 1, 4).args[0] == "worker 3: already named"
    plain = RemoteError("single host")
    assert name_worker(plain, 0, 1).args[0] == "single host"
    interrupt = KeyboardInterrupt()
    assert name_worker(interrupt, 1, 4) is interrupt
