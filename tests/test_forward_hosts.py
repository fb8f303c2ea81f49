"""The forward's core (tpulab.run.forward, tpulab.remote.system_ssh) against a real SSH
host of each emulator backend -- asyncssh (`emulator serve`'s default) and the system
sshd -- with the system OpenSSH client: a page fetched through `ssh -N -L`, the lease
renewed over the same client, a VM answering with another host key refused."""

from __future__ import annotations

import http.server
import shutil
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import require_tool, wait_until

from tpulab.config.forward import Forward
from tpulab.errors import CommandFailedError
from tpulab.remote.keys import HostKey, RunKey
from tpulab.remote.system_ssh import SystemSsh, write_known_hosts
from tpulab.remote.watchdog import WatchdogConfig
from tpulab.run.forward import Forwarding, check_local_ports_free, forward_argv
from tpulab.run.lease import LeaseRenewer

if TYPE_CHECKING:
    from ssh_fixtures import SshHost

pytest_plugins = ["ssh_fixtures"]


@pytest.fixture(autouse=True)
def _needs_ssh_client() -> None:
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")


@pytest.fixture
def page_server(tmp_path: Path) -> Iterator[int]:
    """An HTTP server on this machine's loopback -- the emulated VM's localhost."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "index.html").write_text("hello through the tunnel\n")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def client(host: SshHost, tmp_path: Path, host_key: HostKey | None = None) -> SystemSsh:
    key_path = tmp_path / "key"
    if not key_path.exists():
        key_path.write_bytes(host.key.openssh_private_bytes())
        key_path.chmod(0o600)
    target = host.target(host_key=host_key)
    return SystemSsh(target, key_path, write_known_hosts(tmp_path / "known_hosts", target))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_page_through_the_forward_while_the_lease_is_renewed(
    ssh_host: SshHost, tmp_path: Path, page_server: int
) -> None:
    ssh = client(ssh_host, tmp_path)
    forward = Forward(port=free_port(), host="localhost", host_port=page_server)
    check_local_ports_free([forward])
    config = WatchdogConfig("fwd-run", "n", "z", "p", 5.0, 60.0, 3600.0)
    renewer = LeaseRenewer(ssh, config, first_seq=1000)
    renewer.start()
    forwarding = Forwarding(forward_argv(ssh, [forward], command=None), [forward])
    try:
        forwarding.start()
        forwarding.wait_listening()
        url = f"http://127.0.0.1:{forward.port}/index.html"
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.read() == b"hello through the tunnel\n"
        wait_until(lambda: renewer.renewals >= 2, "a background renewal over system ssh")
    finally:
        renewer.stop()
        assert forwarding.end() is not None
    assert forwarding.ended_by_us
    assert renewer.failures == []
    assert '"seq": 1001' in Path(config.lease_path).read_text()
    Path(config.lease_path).unlink()


def test_another_host_key_is_refused_not_prompted(ssh_host: SshHost, tmp_path: Path) -> None:
    stranger = HostKey("ssh-ed25519", RunKey().public_b64)
    ssh = client(ssh_host, tmp_path, host_key=stranger)
    with pytest.raises(CommandFailedError) as refused:
        ssh.run(["true"], timeout=60, check=True)
    assert refused.value.exit_status == 255
    assert "host key" in refused.value.message.lower()
    good = client(ssh_host, tmp_path)
    assert good.run(["echo", "ok"], timeout=60, check=True).stdout.strip() == "ok"
