"""`tpulab ssh S -L [BIND:]PORT[:HOST:HOSTPORT]` and `tpulab notebook S --port P`: the
local port forwards, validated before anything is read or sent.

The spec is OpenSSH's own `-L` syntax (what the TPU profiling guide passes through
`--ssh-flag`), restricted to TCP ports: `PORT` alone forwards localhost:PORT on the VM;
`BIND:PORT` chooses the laptop address; a host in brackets may be an IPv6 address.
Without BIND the forward listens on the laptop's loopback only (OpenSSH's default with
GatewayPorts off), so a notebook's token is the only thing between a browser tab and the
TPU, never the network.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tpulab.errors import ConfigError

__all__ = ["LOOPBACK_BINDS", "Forward", "check_port", "parse_forward", "parse_forwards"]

# The laptop addresses that keep a forward to this machine; anything else is announced.
LOOPBACK_BINDS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]|\*")
_EXAMPLE = "e.g. -L 8888 (localhost:8888 on the VM) or -L 16006:localhost:6006"


@dataclass(frozen=True)
class Forward:
    """One `-L`: the laptop's BIND:PORT reaches HOST:HOST_PORT as seen from the VM."""

    port: int
    host: str = "localhost"
    host_port: int = 0  # 0: the same as `port`
    bind: str | None = None  # None: loopback only

    @property
    def remote_port(self) -> int:
        return self.host_port or self.port

    @property
    def ssh_arg(self) -> str:
        """The argument of OpenSSH's `-L`."""
        local = f"{self.bind}:{self.port}" if self.bind else str(self.port)
        return f"{local}:{self.host}:{self.remote_port}"

    @property
    def loopback_only(self) -> bool:
        return self.bind is None or self.bind in LOOPBACK_BINDS

    def local_url(self, path: str = "/") -> str:
        host = self.bind if self.bind and self.loopback_only else "localhost"
        return f"http://{host}:{self.port}{path}"

    def describe(self) -> str:
        return f"{self.bind or 'localhost'}:{self.port} -> {self.host}:{self.remote_port} on the VM"


def check_port(flag: str, value: int | str) -> int:
    """A TCP port 1..65535, or ConfigError naming the flag."""
    try:
        port = int(str(value), 10)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ConfigError(
            f"{flag} {value!r}: not a TCP port.",
            hint=f"Give a port between 1 and 65535 ({_EXAMPLE}).",
        )
    return port


def _split(spec: str) -> list[str]:
    """Split on ':' outside brackets, so `[::1]:8080` is two fields."""
    fields, current, depth = [], "", 0
    for char in spec:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == ":" and depth == 0:
            fields.append(current)
            current = ""
        else:
            current += char
    fields.append(current)
    return fields


def _host(flag: str, spec: str, value: str, what: str) -> str:
    if not _HOST.fullmatch(value) or (value == "*" and what == "HOST"):
        raise ConfigError(
            f"{flag} {spec!r}: {what} {value!r} is not a host name or address.",
            hint=f"Use [BIND:]PORT[:HOST:HOSTPORT] ({_EXAMPLE}).",
        )
    return value


def _port(flag: str, spec: str, value: str, what: str) -> int:
    try:
        return check_port(flag, value)
    except ConfigError:
        raise ConfigError(
            f"{flag} {spec!r}: {what} {value!r} is not a TCP port (1..65535).",
            hint=f"Use [BIND:]PORT[:HOST:HOSTPORT] ({_EXAMPLE}).",
        ) from None


def parse_forward(spec: str, flag: str = "-L") -> Forward:
    """`[BIND:]PORT[:HOST:HOSTPORT]` as a Forward; ConfigError (exit 2) naming what is wrong."""
    fields = _split(spec.strip())
    if len(fields) not in (1, 2, 3, 4) or not all(fields):
        raise ConfigError(
            f"{flag} {spec!r} is not [BIND:]PORT[:HOST:HOSTPORT].",
            hint=f"Give a local port, optionally the VM side: {_EXAMPLE}.",
        )
    bind: str | None = None
    if len(fields) in (2, 4):
        bind = _host(flag, spec, fields.pop(0), "BIND")
    port = _port(flag, spec, fields[0], "PORT")
    if len(fields) == 1:
        return Forward(port=port, bind=bind)
    host = _host(flag, spec, fields[1], "HOST")
    return Forward(
        port=port, host=host, host_port=_port(flag, spec, fields[2], "HOSTPORT"), bind=bind
    )


def parse_forwards(specs: Sequence[str]) -> list[Forward]:
    """Every `-L`, each checked, and no local port given twice (the second would fail
    to listen only after the first forward is up)."""
    forwards = [parse_forward(spec) for spec in specs]
    seen: set[tuple[str | None, int]] = set()
    for forward in forwards:
        key = (None if forward.loopback_only else forward.bind, forward.port)
        if key in seen:
            raise ConfigError(
                f"-L: local port {forward.port} is given twice.",
                hint="Give each forward its own local port.",
            )
        seen.add(key)
    return forwards
