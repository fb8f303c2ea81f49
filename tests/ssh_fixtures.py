"""Real SSH hosts for tests, over both backends (a pytest plugin module).

Use from a test module with `pytest_plugins = ["ssh_fixtures"]`, then ask for:

- `host_backend`: a `HostBackend`, parametrized over "embedded" (asyncssh) and
  "openssh" (the system sshd; skipped locally when missing, FAILS in CI). Closed after.
- `ssh_host`: one started node on that backend, with a fresh `RunKey` in its metadata
  (`SshHost.connect()` gives a `Connection` to it).
- `start_ssh_host(sandbox, node_key=..., refuse_for=...)`: start more nodes yourself.

Import names from here only under `TYPE_CHECKING`: a runtime import before pytest loads
the plugin defeats its assertion rewriting (pytest warns).

`login_user(backend, metadata_user)` is the name to log in with: sshd can only log in
existing accounts, so the OpenSSH backend maps every metadata user onto the account the
tests run as.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from helpers import require_tool

from tpulab.emulator.backends import HostBackendKind, make_host_backend
from tpulab.emulator.hosts import HostBackend, HostEndpoint
from tpulab.emulator.openssh import DEFAULT_SSHD, OpenSshHostBackend, find_sftp_server
from tpulab.remote.ssh import Connection, HostKey, RunKey, SshTarget

__all__ = [
    "METADATA_USER",
    "HostStarter",
    "SshHost",
    "host_backend",
    "login_user",
    "ssh_host",
    "start_host",
    "start_ssh_host",
]

METADATA_USER = "tpulab"


def login_user(backend: HostBackend, metadata_user: str) -> str:
    if isinstance(backend, OpenSshHostBackend):
        return backend.login_user
    return metadata_user


def sshd_available() -> bool:
    return os.access(DEFAULT_SSHD, os.X_OK) and find_sftp_server() is not None


@pytest.fixture(
    params=[
        pytest.param("embedded", id="embedded"),
        pytest.param("openssh", id="openssh", marks=pytest.mark.openssh),
    ]
)
def host_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HostBackend]:
    kind: HostBackendKind = request.param
    if kind == "openssh":
        require_tool(sshd_available(), f"OpenSSH server ({DEFAULT_SSHD} and sftp-server)")
    # Preloaded (the controller's jax): these tests are about SSH and the lifecycle, not
    # the install; tests/test_bootstrap.py and test_bare_image_e2e.py use the bare image.
    backend = make_host_backend(kind, tmp_path / "ssh-hosts", image="preloaded")
    try:
        yield backend
    finally:
        backend.close()


@dataclass
class SshHost:
    backend: HostBackend
    endpoint: HostEndpoint
    sandbox: Path
    key: RunKey
    user: str

    @property
    def host_key(self) -> HostKey:
        return HostKey(self.endpoint.host_key_type, self.endpoint.host_key_b64)

    def target(self, *, host_key: HostKey | None = None, user: str | None = None) -> SshTarget:
        return SshTarget(
            self.endpoint.host,
            self.endpoint.port,
            user or self.user,
            host_key or self.host_key,
        )

    def connect(
        self, *, key: RunKey | None = None, host_key: HostKey | None = None, **kwargs: Any
    ) -> Connection:
        kwargs.setdefault("connect_timeout", 10.0)
        return Connection(self.target(host_key=host_key), key or self.key, **kwargs)


def start_host(
    backend: HostBackend, sandbox: Path, *, node_key: str = "node-1", refuse_for: float = 0.0
) -> SshHost:
    key = RunKey()
    endpoint = backend.start(
        node_key, sandbox, key.metadata_entry(METADATA_USER), refuse_for=refuse_for
    )
    return SshHost(backend, endpoint, sandbox, key, login_user(backend, METADATA_USER))


@pytest.fixture
def ssh_host(host_backend: HostBackend, tmp_path: Path) -> SshHost:
    return start_host(host_backend, tmp_path / "sandbox")


class HostStarter(Protocol):
    def __call__(
        self, sandbox: Path, *, node_key: str = "node-1", refuse_for: float = 0.0
    ) -> SshHost: ...


@pytest.fixture
def start_ssh_host(host_backend: HostBackend) -> HostStarter:
    def start(sandbox: Path, *, node_key: str = "node-1", refuse_for: float = 0.0) -> SshHost:
        return start_host(host_backend, sandbox, node_key=node_key, refuse_for=refuse_for)

    return start
