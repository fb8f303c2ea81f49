"""The emulator's wire: a stdlib HTTP/1.1 server that hands each request to one call of
an `Answerer` (the `Emulator`, server.py) and writes back its (status, JSON body).

Kept apart from what the API answers so each has one job: here, request bodies that are
not JSON objects (or carry NaN/Infinity) are refused as Google's front ends refuse them,
an answer that cannot be JSON becomes a 500 that is, an emulator bug is a 500 naming
itself rather than a dropped connection, and each connection is reported opened and
closed so `Emulator.stop()` can end kept-alive sessions.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from tpulab.emulator.persist import EmulatorStateError
from tpulab.emulator.wire import ApiError, error_body

__all__ = ["Answerer", "ApiServer", "api_handler", "reachable"]

log = logging.getLogger(__name__)

Record = dict[str, Any]


class Answerer(Protocol):
    """What the server serves: one answer per request, and word of each connection."""

    def handle(
        self,
        method: str,
        raw_path: str,
        body: Record,
        *,
        has_body: bool = True,
        authorization: str = "",
    ) -> tuple[int, Record]: ...

    def track_connection(self, connection: socket.socket, alive: bool) -> None: ...


def reachable(bound: str) -> str:
    """An address clients can connect to: a wildcard bind is reachable on loopback."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(bound, bound)
    return f"[{host}]" if ":" in host else host


def _refuse_constant(name: str) -> Any:
    # json.loads accepts NaN and Infinity, which are not JSON; refuse them on input so
    # they can never come back out (as the faults endpoint used to echo `Infinity`).
    raise ValueError(f"{name} is not valid JSON")


class ApiServer(ThreadingHTTPServer):
    """The HTTP server, quiet about clients that go away mid-request (a killed tpulab,
    a test's reset socket): socketserver would print a ConnectionResetError traceback to
    the served emulator's terminal for each. Anything else still gets its traceback."""

    dropped_clients = 0  # connections the client reset or closed mid-request

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            self.dropped_clients += 1
            log.debug("client %s went away mid-request: %r", client_address, error)
            return
        super().handle_error(request, client_address)


def api_handler(answerer: Answerer) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "tpulab-emulator"
        # TCP_NODELAY: the headers and the body go out as two writes, and on a kept-alive
        # connection Nagle held the body until the client's delayed ACK of the headers:
        # 48 ms a request instead of 2 (tests/benchmarks/bench_api_latency.py). Google's
        # front ends answer without that stall.
        disable_nagle_algorithm = True
        timeout = 60  # idle keep-alive connections are closed after this

        def setup(self) -> None:
            super().setup()
            answerer.track_connection(self.connection, True)

        def finish(self) -> None:
            answerer.track_connection(self.connection, False)
            super().finish()

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw, parse_constant=_refuse_constant) if raw.strip() else {}
                if not isinstance(body, dict):
                    raise ValueError("the request body must be a JSON object")
            except ValueError as bad:
                status, answer = (
                    400,
                    error_body(ApiError(400, "INVALID_ARGUMENT", f"Invalid JSON payload: {bad}")),
                )
            else:
                try:
                    status, answer = answerer.handle(
                        self.command,
                        self.path,
                        body,
                        has_body=bool(raw.strip()),
                        authorization=self.headers.get("Authorization") or "",
                    )
                except EmulatorStateError as error:
                    status, answer = 500, error_body(ApiError(500, "INTERNAL", str(error)))
                except Exception as error:  # a bug in the emulator: say so on the wire
                    log.exception("emulator failed on %s %s", self.command, self.path)
                    status, answer = (
                        500,
                        error_body(ApiError(500, "INTERNAL", f"Emulator error: {error}")),
                    )
            try:
                payload = json.dumps(answer, allow_nan=False).encode("utf-8")
            except ValueError as error:  # NaN/inf set in-process (a test): still speak JSON
                log.error(
                    "emulator answer to %s %s is not JSON: %s", self.command, self.path, error
                )
                status = 500
                refusal = ApiError(500, "INTERNAL", f"Emulator error: answer not JSON: {error}")
                payload = json.dumps(error_body(refusal)).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = _serve
        do_POST = _serve
        do_DELETE = _serve
        do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s - %s", self.address_string(), format % args)

    return _Handler
