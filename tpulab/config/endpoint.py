"""Which Cloud TPU API a command talks to, and what may be sent there: the one endpoint rule.

    Target      --emulate (the embedded emulator) or an `Endpoint`
    Endpoint    kind "google"   : no --api-endpoint, or https://*.googleapis.com
                kind "loopback" : an emulator on this machine (localhost, 127.0.0.0/8, ::1)
                kind "other"    : anything else (a proxy, a remote emulator, a typo)

Two decisions come from this rule and from nowhere else, so they can never disagree:
whether a run is emulated (its nodes are CPU hosts: only the embedded emulator or a
loopback endpoint), and whether Application Default Credentials are attached (only to a
Google endpoint over https; every other endpoint is sent requests without credentials,
so a bearer token never travels in cleartext or to a host that is not Google's).
There is no opt-in to send credentials elsewhere: nothing tpulab talks to needs it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from tpulab.errors import ConfigError

__all__ = [
    "GOOGLE_API_DOMAIN",
    "Endpoint",
    "EndpointKind",
    "Mode",
    "Target",
    "choose_target",
    "classify_endpoint",
]

EndpointKind = Literal["google", "loopback", "other"]
Mode = Literal["google", "emulate", "endpoint"]

GOOGLE_API_DOMAIN = "googleapis.com"
_EXAMPLE = "Give a URL such as http://127.0.0.1:8470 (`tpulab emulator serve` prints it)."


@dataclass(frozen=True)
class Endpoint:
    """A validated Cloud TPU API endpoint. `url` None means Google's default endpoint."""

    url: str | None
    kind: EndpointKind

    @property
    def is_loopback(self) -> bool:
        """An emulator on this machine: its nodes are CPU hosts and it answers fast."""
        return self.kind == "loopback"

    @property
    def sends_credentials(self) -> bool:
        """Whether Application Default Credentials may be attached (Google over https only).

        `classify_endpoint` refuses a Google host over http, so kind alone decides; the
        scheme is checked again because a bearer token in cleartext is the worst case.
        """
        return self.kind == "google" and (self.url is None or self.url.startswith("https://"))


def _is_loopback_host(host: str) -> bool:
    if host in {"localhost", "localhost."}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_google_host(host: str) -> bool:
    return host == GOOGLE_API_DOMAIN or host.endswith("." + GOOGLE_API_DOMAIN)


def classify_endpoint(url: str | None) -> Endpoint:
    """Validate `--api-endpoint` and say what it is; None is Google's default endpoint.

    An empty or malformed URL is a ConfigError (never a silent fall-back to Google).
    """
    if url is None:
        return Endpoint(None, "google")
    text = url.strip()
    if not text:
        raise ConfigError(
            "--api-endpoint is empty.",
            hint="Leave --api-endpoint out to use Google's Cloud TPU API. " + _EXAMPLE,
        )
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ConfigError(f"Invalid API endpoint {url!r}.", hint=_EXAMPLE)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"Invalid API endpoint {url!r}: it carries a user name or password.",
            hint="Remove the credentials from the URL; tpulab never sends them. " + _EXAMPLE,
        )
    if parts.query or parts.fragment or parts.path not in {"", "/"}:
        raise ConfigError(
            f"Invalid API endpoint {url!r}: only a scheme, host and port are used.",
            hint="Drop the path, query or fragment; the client adds /v2/... itself. " + _EXAMPLE,
        )
    host = parts.hostname.lower()
    if _is_google_host(host):
        if parts.scheme != "https":
            raise ConfigError(
                f"Refusing to talk to Google's API in cleartext: {url!r}.",
                hint=f"Use https://{host}" + (f":{port}" if port else "") + ".",
            )
        return Endpoint(text, "google")
    return Endpoint(text, "loopback" if _is_loopback_host(host) else "other")


@dataclass(frozen=True)
class Target:
    """Where a command's API calls go: the embedded emulator, or an `Endpoint`."""

    endpoint: Endpoint | None  # None: the embedded emulator (--emulate)

    @property
    def emulate(self) -> bool:
        return self.endpoint is None

    @property
    def mode(self) -> Mode:
        if self.endpoint is None:
            return "emulate"
        return "google" if self.endpoint.url is None else "endpoint"

    @property
    def api_endpoint(self) -> str | None:
        """The --api-endpoint URL, None for Google's default and for --emulate."""
        return None if self.endpoint is None else self.endpoint.url

    @property
    def emulated(self) -> bool:
        """The platform decision: nodes of a local emulator are CPU hosts, never TPUs."""
        return self.endpoint is None or self.endpoint.is_loopback


def choose_target(*, emulate: bool, api_endpoint: str | None) -> Target:
    """The API of a command from its --emulate / --api-endpoint flags (the one check)."""
    if emulate and api_endpoint is not None:
        raise ConfigError(
            "--emulate and --api-endpoint exclude each other.",
            hint="--emulate starts an emulator in this process; --api-endpoint URL uses one "
            "served by `tpulab emulator serve`.",
        )
    return Target(None if emulate else classify_endpoint(api_endpoint))
