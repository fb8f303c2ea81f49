"""The controller's half of the VM's dead man's switch: renew the lease, read the state.

- `watchdog_config(spec)`: the `WatchdogConfig` a run's startup-script carries (None
  with --no-watchdog).
- `LeaseRenewer`: renews the lease over the run's SSH Connection (one exec channel per
  renewal; paramiko multiplexes channels over the one transport) -- once in the
  foreground when the session opens, then from a daemon thread every
  `config.renew_seconds` until `stop()`, which the lifecycle calls before the teardown.
  A failed renewal is noted, never raised: the laptop-side teardown is the first line,
  the watchdog the second, and a renewal is only what keeps the second line quiet.
- `read_state(...)`: the watchdog's guest attribute, waited for a little after SSH is
  up (the startup-script and SSH logins start concurrently on a real VM: the guest
  agent orders sshd, not the startup-scripts unit).
- `node_gone(...)`: GetNode's answer to "is this node gone (or going)?".
- `vanished(...)`: what to say when the node disappears under a live run -- the watchdog's
  deadline, a lapsed lease (the controller was stopped), or someone else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from tpulab.errors import (
    CloudError,
    NodeVanishedError,
    NotFoundError,
    TpuLabError,
    TransientError,
)
from tpulab.polling import Backoff, poll_until
from tpulab.remote.watchdog import (
    STATE_ATTRIBUTE,
    WatchdogConfig,
    WatchdogState,
    parse_state,
    renew_command,
)
from tpulab.run.workers import RunsCommands

if TYPE_CHECKING:
    from tpulab.cloud.api import TpuApi
    from tpulab.config import RunSpec
    from tpulab.models import NodeInfo

__all__ = [
    "LeaseRenewer",
    "look_up",
    "node_gone",
    "read_state",
    "stop_renewers",
    "vanished",
    "watchdog_config",
]

# How long after SSH is up the controller waits for the watchdog to say how it is.
STATE_WAIT_SECONDS = 30.0


def watchdog_config(spec: RunSpec) -> WatchdogConfig | None:
    """The run's watchdog as its startup-script carries it; None with --no-watchdog."""
    settings = spec.watchdog
    deadline = spec.max_duration_seconds
    if settings is None or deadline is None:
        return None
    return WatchdogConfig(
        run_id=spec.run_id,
        node_name=spec.node_name,
        zone=spec.zone.value,
        project=spec.project.value,
        lease_seconds=settings.lease_seconds,
        boot_grace_seconds=settings.boot_grace_seconds,
        max_duration_seconds=deadline,
        queued_resource=spec.node_name if spec.queued else None,
        provider=spec.provider,
        api_base=_compute_base(spec) if spec.provider == "compute" else "",
    )


def _compute_base(spec: RunSpec) -> str:
    """The root a Compute instance's watchdog deletes it at (its paths say compute/v1/):
    Google's, or the --api-endpoint that also serves Compute (tpulab.cloud.preflight).
    None under --emulate: the embedded emulator's port is not known to the spec (nor the
    plan), and its VMs' environment names it (TPULAB_TPU_API_BASE, which the watchdog
    reads when its config has no api_base)."""
    if spec.mode == "emulate":
        return ""
    if spec.api_endpoint is None:
        return "https://compute.googleapis.com/"
    return spec.api_endpoint.rstrip("/") + "/"


# How long stopping the renewers (the first step of every teardown) waits for a renewal
# in flight: a live link's renewal takes well under a second.
STOP_WAIT_SECONDS = 3.0


@dataclass
class LeaseRenewer:
    """Renews one run's lease until stopped; `failures` says what went wrong."""

    session: RunsCommands
    config: WatchdogConfig
    note: Callable[[str], None] = lambda _message: None
    background: bool = True  # False: only the foreground renewal (a dry run's plan)
    # The watchdog counts a renewal only when the lease file's text CHANGES: a renewer
    # that writes after another one's (a forward after an exec) starts from a seq that
    # cannot repeat theirs (tpulab.run.forward passes the wall clock in ms).
    first_seq: int = 1
    clock: Callable[[], float] = time.monotonic
    renewals: int = 0
    failures: list[str] = field(default_factory=list)
    last_renewed: float | None = None
    longest_gap: float = 0.0  # the longest stretch between two renewals so far
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _failing_since: float | None = None

    def start(self) -> None:
        """Renew once now (the watchdog's boot grace ends with it), then keep renewing."""
        self.renew()
        if self.background and self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name=f"tpulab-lease-{self.config.run_id}", daemon=True
            )
            self._thread.start()

    def renew(self) -> bool:
        """One renewal; False (and a note, once per failing stretch) if it failed."""
        with self._lock:
            if self._stop.is_set():
                return False
            try:
                self.session.run(
                    renew_command(self.config, self.first_seq + self.renewals),
                    timeout=min(self.config.lease_seconds, 20.0),
                    check=True,
                )
            except TpuLabError as error:
                return self._failed(error.message)
            except Exception as error:  # a broken transport, seen from this thread
                return self._failed(f"{type(error).__name__}: {error}")
            self.renewals += 1
            now = self.clock()
            if self.last_renewed is not None:
                self.longest_gap = max(self.longest_gap, now - self.last_renewed)
            self.last_renewed = now
            if self._failing_since is not None:
                self._failing_since = None
                self.note("lease renewals work again")
            return True

    def _failed(self, why: str) -> bool:
        self.failures.append(why)
        now = self.clock()
        if self._failing_since is None:
            self._failing_since = now
            self.note(
                f"lease renewal failed ({why}); the VM deletes itself if renewals keep "
                f"failing for {self.config.lease_seconds:g} s (the teardown still runs)"
            )
        return False

    def lapsed(self) -> bool:
        """Has the lease possibly run out on the VM: no renewal for a whole lease, now or
        at any time since the first (a suspended laptop may renew again on waking, into
        a session that has not noticed yet that its VM is gone)?"""
        left = self.lapses_in()
        return left is None or left <= 0

    def lapses_in(self) -> float | None:
        """Seconds until the lease may lapse on the VM if no renewal succeeds meanwhile
        (0: it may have already); None before the first renewal."""
        last = self.last_renewed
        if last is None:
            return None
        if self.longest_gap >= self.config.lease_seconds:
            return 0.0
        return max(0.0, self.config.lease_seconds - (self.clock() - last))

    @property
    def renewing(self) -> bool:
        """Did the last renewal go through (the link to the VM is up)?"""
        return self.last_renewed is not None and self._failing_since is None

    def halt(self) -> None:
        """No renewal starts after this (one in flight ends as it will); `stop` waits."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.config.renew_seconds):
            self.renew()

    def stop(self, wait: float = STOP_WAIT_SECONDS) -> None:
        """No renewal starts after this returns, and one in flight is waited for, `wait`
        seconds at most in all: the session can then be closed without the renewer
        racing to reopen it. A renewal over a live link ends in well under a second; one
        still reconnecting to a link that is down (each try may take 20 s) is not waited
        out: it fails on its own, or reopens a connection nothing uses after."""
        self._stop.set()
        deadline = time.monotonic() + wait
        if self._lock.acquire(timeout=wait):
            self._lock.release()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def stop_renewers(renewers: list[LeaseRenewer], wait: float = STOP_WAIT_SECONDS) -> None:
    """Stop every renewer (a slice's, one a worker), `wait` seconds at most for them all:
    none starts a renewal once this returns. Every one is told first, so a renewal stuck
    on a dead link delays the teardown once, not once per worker."""
    for renewer in renewers:
        renewer.halt()
    deadline = time.monotonic() + wait
    for renewer in renewers:
        renewer.stop(wait=max(0.0, deadline - time.monotonic()))


def read_state(
    api: TpuApi,
    zone: str,
    node_name: str,
    *,
    timeout: float = STATE_WAIT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> WatchdogState:
    """The watchdog's published state, asked of the API (once SSH is up, so it is
    usually there at once) until it appears or `timeout` passes ("unpublished")."""

    def fetch() -> str | None:
        attributes = api.guest_attributes(zone, node_name, STATE_ATTRIBUTE.split("/")[0] + "/")
        return attributes.get(STATE_ATTRIBUTE)

    try:
        value = poll_until(
            fetch,
            lambda found: found is not None,
            timeout=timeout,
            clock=clock,
            sleep=sleep,
            backoff=Backoff(0.5, 5.0, factor=2.0),
            retry_if=lambda error: isinstance(error, TransientError | NotFoundError),
            describe=lambda _value: f"the VM's watchdog to publish its state ({STATE_ATTRIBUTE})",
        )
    except CloudError:
        return parse_state(None)
    return parse_state(value)


def node_gone(api: TpuApi, zone: str, node_name: str) -> Literal["gone", "DELETING"] | None:
    """Has the node gone (GetNode says NotFound) or is it being deleted? None when it is
    still there, or when the API could not say (then nothing may be concluded)."""
    return look_up(api, zone, node_name)[0]


def look_up(
    api: TpuApi, zone: str, node_name: str
) -> tuple[Literal["gone", "DELETING"] | None, NodeInfo | None]:
    """One GetNode: `node_gone`'s answer, and the node when the API showed it (None
    when it could not say)."""
    from tpulab.models import NodeState

    try:
        node = api.get_node(zone, node_name)
    except NotFoundError:
        return "gone", None
    except CloudError:
        return None, None
    return ("DELETING" if node.state == NodeState.DELETING else None), node


def vanished(
    api: TpuApi,
    zone: str,
    node_name: str,
    *,
    phase: str,
    error: TpuLabError,
    renewer: LeaseRenewer | None,
    deadline_passed: bool,
) -> NodeVanishedError | None:
    """A `NodeVanishedError` naming the likely cause when the node is gone or DELETING; None
    when it is still there (the error was something else)."""
    state = node_gone(api, zone, node_name)
    if state is None:
        return None
    if deadline_passed:
        cause = "its watchdog deleted it: the hard deadline (--max-duration) passed"
        hint = (
            "The run outlived --max-duration. Give it a longer --max-duration (or leave it "
            "out: the default adds up the run's timeouts)."
        )
    elif renewer is not None and renewer.lapsed():
        cause = (
            f"its watchdog deleted it: no lease renewal reached it for "
            f"{renewer.config.lease_seconds:g} s (was this process stopped or offline?)"
        )
        hint = (
            "A suspended laptop or a lost network lets the lease lapse by design. Pass a "
            "longer --lease if the pauses are expected."
        )
    else:
        cause = "it was deleted by its watchdog or externally (not by this run)"
        hint = "Check who deleted it in the project's audit log; retry the run."
    return NodeVanishedError(
        f"Node {node_name} in {zone} is {state} during {phase}: {cause} ({error.message}).",
        hint=hint,
    )
