"""A forwarding HTTP gate in front of the emulator that holds chosen requests.

A phase that waits on the Cloud TPU API (the create operation, the host key in guest
attributes, the delete during teardown) lasts as long as the gate holds that node's
request: a test signals the run while the request is held and provably in flight
(`Hold.reached`), then releases it. No timing window has to be guessed, so a loaded
machine makes a test slower, never wrong.

Everything else passes through unchanged, byte for byte: the real client talks to the
real emulator, the gate only decides when. A held request is forwarded (not answered
by the gate) once released, or after `HOLD_LIMIT` seconds so nothing waits for ever.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import urlsplit

__all__ = ["ApiGate", "Hold", "HoldWhat", "served_gate"]

HOLD_LIMIT = 300.0
HoldWhat = Literal["create-operation", "guest-attributes", "delete"]

# Hop-by-hop headers are the connection's own, never forwarded (RFC 9110 §7.6.1).
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Hold:
    """Holds one node's requests of one kind until `release()`."""

    node: str
    what: HoldWhat
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    operation: str | None = None  # for "create-operation": learnt from the create reply

    def matches(self, method: str, path: str) -> bool:
        route = urlsplit(path).path
        if self.what == "guest-attributes":
            return method == "POST" and route.endswith(f"/nodes/{self.node}:getGuestAttributes")
        if self.what == "delete":
            return method == "DELETE" and route.endswith(f"/nodes/{self.node}")
        return method == "GET" and self.operation is not None and route.endswith(self.operation)

    def release(self) -> None:
        self.released.set()

    def wait_reached(self, timeout: float = 90.0) -> None:
        if not self.reached.wait(timeout):
            raise AssertionError(f"no {self.what} request of {self.node} reached the gate")


class ApiGate:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        assert parts.hostname is not None, upstream
        assert parts.port is not None, upstream
        self._upstream = (parts.hostname, parts.port)
        self._holds: list[Hold] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}"

    def hold(self, node: str, what: HoldWhat) -> Hold:
        hold = Hold(node, what)
        with self._lock:
            self._holds.append(hold)
        return hold

    def holds(self, node: str, what: HoldWhat) -> list[Hold]:
        with self._lock:
            return [h for h in self._holds if h.node == node and h.what == what]

    def release_all(self) -> None:
        with self._lock:
            for hold in self._holds:
                hold.release()

    def _wait_if_held(self, method: str, path: str) -> None:
        with self._lock:
            held = [h for h in self._holds if not h.released.is_set() and h.matches(method, path)]
        for hold in held:
            hold.reached.set()
            hold.released.wait(HOLD_LIMIT)

    def _learn(self, method: str, path: str, status: int, body: bytes) -> None:
        """A create's reply names its operation: that is what a create hold holds."""
        created = re.search(r"/nodes\?(?:.*&)?nodeId=([^&]+)", path)
        if method != "POST" or created is None or status != 200:
            return
        with suppress(ValueError, KeyError, TypeError):
            operation = str(json.loads(body)["name"])
            with self._lock:
                for hold in self._holds:
                    if hold.what == "create-operation" and hold.node == created.group(1):
                        hold.operation = operation

    def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        self._wait_if_held(method, path)
        upstream = http.client.HTTPConnection(*self._upstream, timeout=120)
        try:
            upstream.request(method, path, body=body or None, headers=headers)
            reply = upstream.getresponse()
            data = reply.read()
            kept = [(k, v) for k, v in reply.getheaders() if k.lower() not in _HOP_BY_HOP]
        finally:
            upstream.close()
        self._learn(method, path, reply.status, data)
        return reply.status, kept, data

    def start(self) -> None:
        threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="api-gate",
            daemon=True,
        ).start()

    def stop(self) -> None:
        self.release_all()
        self._server.shutdown()
        self._server.server_close()


def _handler(gate: ApiGate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # as the emulator's: no 40 ms delayed-ACK stall

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            try:
                status, kept, data = gate.forward(self.command, self.path, headers, body)
            except OSError as error:  # the emulator went away: say so, as a proxy would
                status, kept, data = 502, [], f"gate: {error}".encode()
            with suppress(OSError):  # the client may have been killed meanwhile
                self.send_response(status)
                for key, value in kept:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _any

        def log_message(self, format: str, *args: object) -> None:
            del format, args  # quiet: pytest shows the failing test's own output

    return Handler


@contextmanager
def served_gate(upstream: str) -> Iterator[ApiGate]:
    gate = ApiGate(upstream)
    gate.start()
    try:
        yield gate
    finally:
        gate.stop()
