"""A real SSH connection whose TCP stream a test can cut, as a network that drops does.

Shared by the end-to-end tests of what a run does when the link drops under one of its
steps (tests/test_workload_e2e.py, tests/test_verifier_drops.py).
"""

from __future__ import annotations

import socket
import time

from tpulab.remote.keys import RunKey, SshTarget
from tpulab.remote.ssh import Connection

__all__ = ["CutConnection", "SteppedClock"]


class CutConnection(Connection):
    """A real connection that counts its connects and can have its TCP stream cut (its
    socket shut down under paramiko)."""

    def __init__(self, target: SshTarget, key: RunKey) -> None:
        super().__init__(target, key, connect_timeout=15)
        self.connects = 0

    def open(self) -> None:
        if self._client is None:
            self.connects += 1
        super().open()

    def cut_now(self) -> None:
        transport = self._client.get_transport() if self._client is not None else None
        assert transport is not None
        transport.sock.shutdown(socket.SHUT_RDWR)


class SteppedClock:
    """The run's clock (RunContext's `clock` seam): this machine's, plus what an outage
    skipped, so a long outage costs the test no real minutes."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped
