"""The worker VMs of a node, and the one way a phase runs a step on all of them.

A single-host node has one worker; a multi-host slice (v5litepod-16: 4 workers) has one
VM per `Node.networkEndpoints[]` entry, each with its own host key, SSH session and
lease. `fan_out` is how every remote phase acts on them: the same step on every worker
at once (bounded), results in worker order, and the FIRST failure raised at once with
its worker named, so a slice fails fast rather than waiting for its slowest worker to
finish a step that no longer matters (the teardown that follows closes the others'
sessions, which ends what they were doing). One worker runs inline, on the caller's
thread, exactly as before slices existed.

Threads, not a pool: a pool's threads are joined at interpreter exit, so one hung SSH
read would hold `tpulab` open after its teardown; these are daemons, and a Ctrl-C in the
waiting (main) thread interrupts the wait as it interrupts any phase.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, cast

from tpulab.errors import TpuLabError

if TYPE_CHECKING:
    from tpulab.remote.keys import SshTarget
    from tpulab.run.lease import LeaseRenewer
    from tpulab.run.remote_session import RemoteSession

__all__ = [
    "MAX_PARALLEL",
    "EveryWorker",
    "FanOut",
    "RunsCommands",
    "Worker",
    "fan_out",
    "name_worker",
    "place",
]

# SSH sessions opened at once at most (MaxText's multihost_runner starts one process per
# worker; 16 covers every slice in the catalog in one wave).
MAX_PARALLEL = 16

T = TypeVar("T")
Item = TypeVar("Item")


@dataclass
class Worker:
    """One worker VM: where to reach it, and what the run holds open on it."""

    index: int
    target: SshTarget
    session: RemoteSession | None = None
    renewer: LeaseRenewer | None = None
    # What the verifier left on this worker: its exit status, output and receipt.
    payload_exit: int | None = None
    payload_output: list[str] = field(default_factory=list)
    raw_receipt: bytes | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"worker {self.index}"


def place(worker: Worker, of: int) -> str:
    """Where a message says something happened: "the VM" on a single host, "worker N" on
    a slice of `of` workers."""
    return "the VM" if of == 1 else f"worker {worker.index}"


def name_worker(error: BaseException, index: int, of: int) -> BaseException:
    """`error` with its worker named in its message (only on a slice: a single-host run's
    errors read as they always have). The error keeps its type, so exit statuses and the
    report's classification do not change."""
    if of > 1 and isinstance(error, TpuLabError) and error.worker is None:
        error.worker = index
        if not error.message.startswith("worker "):
            error.message = f"worker {index}: {error.message}"
            error.args = (error.message, *error.args[1:])
    return error


@dataclass
class FanOut(Generic[T]):
    """What a fan-out returns: each worker's result, in worker order, and how long each
    took (the summary names the slowest)."""

    results: list[T]
    seconds: list[float]

    def slowest(self) -> tuple[int, float]:
        index = max(range(len(self.seconds)), key=self.seconds.__getitem__)
        return index, self.seconds[index]

    def describe(self) -> str:
        """ "4/4 workers, slowest worker 2 in 12.3s" ("" for one worker: nothing to add)."""
        if len(self.results) < 2:
            return ""
        index, seconds = self.slowest()
        done = len(self.results)
        return f"{done}/{done} workers, slowest worker {index} in {seconds:.1f}s"


def fan_out(
    workers: Sequence[Item],
    step: Callable[[Item], T],
    *,
    what: str,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[str], None] | None = None,
    max_parallel: int = MAX_PARALLEL,
) -> FanOut[T]:
    """`step` on every worker at once; FanOut in worker order, or the first failure.
    `workers` are in worker order (position i is worker i): `Worker`s, or worker indexes
    before their targets are known.

    `progress` hears "what: 3/4 workers done" as each finishes (a slice only).
    """
    if len(workers) == 1 or max_parallel == 1:
        # In order on this thread: one worker, or a dry run whose plan lists each
        # worker's steps in worker order (the same steps the threads would send).
        results: list[T] = []
        took: list[float] = []
        for position, worker in enumerate(workers):
            started = clock()
            try:
                results.append(step(worker))
            except BaseException as error:
                raise name_worker(error, position, len(workers)) from None
            took.append(clock() - started)
        return FanOut(results, took)
    done: queue.Queue[tuple[int, bool, object, float]] = queue.Queue()
    gate = threading.Semaphore(max(1, max_parallel))

    def work(position: int, worker: Item) -> None:
        with gate:
            started = clock()
            try:
                value: object = step(worker)
                ok = True
            except BaseException as error:  # every failure goes back to the caller
                value, ok = error, False
            done.put((position, ok, value, clock() - started))

    for position, worker in enumerate(workers):
        threading.Thread(
            target=work,
            args=(position, worker),
            name=f"tpulab-{what}-w{position}",
            daemon=True,
        ).start()
    finished: dict[int, object] = {}
    seconds: dict[int, float] = {}
    while len(finished) < len(workers):
        position, ok, value, spent = done.get()
        if not ok:
            assert isinstance(value, BaseException)
            raise name_worker(value, position, len(workers))
        finished[position], seconds[position] = value, spent
        if progress is not None:
            progress(f"{what}: {len(finished)}/{len(workers)} workers done")
    order = range(len(workers))
    return FanOut([cast(T, finished[i]) for i in order], [seconds[i] for i in order])


class RunsCommands(Protocol):
    """What runs a command on one worker (an SSH session): the lease renewer's and
    EveryWorker's one need of it."""

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = ...,
        timeout: float,
        on_line: Callable[[str, str], None] | None = ...,
        check: bool = ...,
    ) -> object: ...


@dataclass(frozen=True)
class EveryWorker:
    """Several workers' shells as one: `run` sends the same command to each at once and
    succeeds only when every worker's did, raising the first failure with its worker
    named (`fan_out`). A session's lease renewal goes through it (one LeaseRenewer for
    the whole slice): each worker's watchdog reads the lease on its own VM, so a renewal
    that reached only some of them is a failed one, and says which worker it missed."""

    shells: Sequence[RunsCommands]

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        on_line: Callable[[str, str], None] | None = None,
        check: bool = False,
    ) -> list[object]:
        """Each worker's result, in worker order. `on_line` hears worker 0's output only
        (the others' would interleave with it)."""

        def one(position: int) -> object:
            heard = on_line if position == 0 else None
            return self.shells[position].run(
                argv, env=env, timeout=timeout, on_line=heard, check=check
            )

        return fan_out(range(len(self.shells)), one, what="every worker").results
