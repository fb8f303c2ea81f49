"""READY emulated nodes are real SSH hosts (both backends): the host key and port are
published as guest attributes, the per-run key from the node's metadata logs in, the
sandbox is HOME, delete stops the host and removes the sandbox, and a restarted
emulator brings READY nodes' hosts back."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpulab.cloud.polling import wait_for_state
from tpulab.contract import EMULATOR_SSH_USER_ATTRIBUTE as SSH_USER_ATTRIBUTE
from tpulab.errors import ConnectError
from tpulab.models import NodeState
from tpulab.remote.ssh import (
    Connection,
    HostKey,
    RunKey,
    SshTarget,
    ssh_port_from,
    wait_for_host_key,
)

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.emulator.hosts import HostBackend

pytest_plugins = ["emulator_fixtures", "ssh_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"
USER = "tpulab"


def _connect_target(
    api: GoogleTpuApi, backend: HostBackend, name: str
) -> tuple[SshTarget, HostKey]:
    from ssh_fixtures import login_user

    node = wait_for_state(api, ZONE, name, {NodeState.READY}, timeout=20)
    attributes: dict[str, str] = {}

    def fetch() -> dict[str, str]:
        attributes.clear()
        attributes.update(api.guest_attributes(ZONE, name))
        return dict(attributes)

    host_key = wait_for_host_key(fetch, timeout=20)
    # A host on the system's sshd says which existing account it logs in.
    assert attributes.get(SSH_USER_ATTRIBUTE) == getattr(backend, "login_user", None)
    assert node.external_ip is not None
    # The address may be published a tick after READY; re-read it with the host key.
    node = api.get_node(ZONE, name)
    assert node.external_ip == node.ip_address == "127.0.0.1"
    target = SshTarget(
        node.external_ip, ssh_port_from(attributes), login_user(backend, USER), host_key
    )
    return target, host_key


def test_ready_nodes_are_ssh_hosts_through_delete_and_restart(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for, node_request

    state = tmp_path / "state"
    emulator = start_emulator(state, host_backend=host_backend)
    api = api_for(emulator)
    key = RunKey()
    for name in ("ssh-a", "ssh-b"):
        api.create_node(ZONE, name, node_request(ssh_keys=key.metadata_entry(USER)))

    target, first_key = _connect_target(api, host_backend, "ssh-a")
    sandbox = emulator.sandbox(PROJECT, ZONE, "ssh-a")
    with Connection(target, key, connect_timeout=20) as connection:
        result = connection.run("pwd && echo kept > marker.txt", timeout=20, check=True)
    assert Path(result.stdout.strip()).resolve() == sandbox.resolve()
    assert (sandbox / "marker.txt").read_text().strip() == "kept"

    # The emulator dies; a new one on the same state restarts READY nodes' hosts.
    emulator.stop()
    restarted = start_emulator(state, host_backend=host_backend)
    api = api_for(restarted)
    target, second_key = _connect_target(api, host_backend, "ssh-a")
    assert second_key != first_key  # a new host key, published afresh
    with Connection(target, key, connect_timeout=20) as connection:
        again = connection.run("cat marker.txt", timeout=20, check=True)
    assert again.stdout.strip() == "kept"  # same sandbox as before the restart

    # Delete: the SSH host stops and the sandbox goes with the node.
    api.wait_operation(api.delete_node(ZONE, "ssh-a"), timeout=20)
    deadline = time.monotonic() + 10
    while sandbox.exists():
        assert time.monotonic() < deadline, "sandbox of a deleted node is still there"
        time.sleep(0.05)
    with pytest.raises(ConnectError):
        Connection(target, key, connect_timeout=1.0).run("true", timeout=5)
    assert restarted.node_names() == ["ssh-b"]


def test_ssh_refusal_fault_reaches_the_backend(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for, node_request

    from tpulab.emulator.backends import make_host_backend

    backend = make_host_backend("embedded", tmp_path / "hosts")
    try:
        emulator = start_emulator(tmp_path / "state", host_backend=backend)
        api = api_for(emulator)
        key = RunKey()
        # The host starts refusing when the create is under way, so a connection tried
        # less than `refuse` seconds after the create was sent is inside the refusal,
        # whatever the machine's load: that one must be refused. Tried later (a slow
        # READY), it proves nothing either way, so the node is made again with a
        # window four times as long.
        for attempt, refuse in enumerate((2.5, 10.0, 40.0)):
            name = f"slow-ssh-{attempt}"
            emulator.faults.ssh_refuse_for = refuse
            sent = time.monotonic()
            api.create_node(ZONE, name, node_request(ssh_keys=key.metadata_entry(USER)))
            target, _ = _connect_target(api, backend, name)
            # Published (READY, host key, port) yet still refusing, like a booting sshd.
            refused = _refuses(target.host, target.port)
            inside = time.monotonic() - sent < refuse  # measured once the probe is done
            if inside:
                break
        assert inside, "never reached the host inside its refusal"
        assert refused, "the host accepted a connection inside its refusal window"
        with Connection(target, key, connect_timeout=refuse + 20) as connection:
            assert connection.run("echo up", timeout=20, check=True).stdout.strip() == "up"
        ready_host = emulator.snapshot()["nodes"][f"{PROJECT}/{ZONE}/{name}"]
        assert ready_host["host"]["port"] == target.port
    finally:
        backend.close()


def _refuses(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# Each published type, and the host-key algorithm a client pinning it negotiates (an RSA
# key is served with SHA-2 signatures: OpenSSH >= 8.8 no longer accepts "ssh-rsa" SHA-1).
HOST_KEY_ALGORITHMS = {
    "ssh-ed25519": "ssh-ed25519",
    "ecdsa-sha2-nistp256": "ecdsa-sha2-nistp256",
    "ssh-rsa": "rsa-sha2-512",
}


def test_every_published_host_key_type_is_the_one_the_server_presents(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    import base64

    import paramiko
    from emulator_fixtures import api_for, node_request

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    api = api_for(emulator)
    key = RunKey()
    api.create_node(ZONE, "keys", node_request(ssh_keys=key.metadata_entry(USER)))
    target, _ = _connect_target(api, host_backend, "keys")
    published = {
        name.removeprefix("hostkeys/"): value
        for name, value in api.guest_attributes(ZONE, "keys").items()
        if name.startswith("hostkeys/")
    }
    assert sorted(published) == sorted(HOST_KEY_ALGORITHMS)
    for key_type, algorithm in HOST_KEY_ALGORITHMS.items():
        # A real client restricted to the one algorithm a pin of this type implies.
        transport = paramiko.Transport((target.host, target.port))
        try:
            transport.get_security_options().key_types = (algorithm,)
            transport.start_client(timeout=20)
            presented = transport.get_remote_server_key()
        finally:
            transport.close()
        assert presented.get_name() == key_type
        assert presented.asbytes() == base64.b64decode(published[key_type])
    # tpulab's own client, pinning a non-default type, logs in end to end.
    ecdsa = HostKey("ecdsa-sha2-nistp256", published["ecdsa-sha2-nistp256"])
    pinned = SshTarget(target.host, target.port, target.user, ecdsa)
    with Connection(pinned, key, connect_timeout=20) as connection:
        assert connection.run("echo ok", timeout=20, check=True).stdout.strip() == "ok"


def test_update_node_through_the_client_library_adds_a_key_the_host_then_accepts(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    """What gcloud `tpu-vm ssh` does: PATCH ?updateMask=metadata with one more ssh-keys
    line; the operation returns the updated node and the live host takes the new key."""
    from emulator_fixtures import api_for, node_request
    from google.api_core.client_options import ClientOptions
    from google.api_core.exceptions import BadRequest
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2
    from google.protobuf import field_mask_pb2

    from tpulab.errors import AuthError

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    api = api_for(emulator)
    first, second = RunKey(), RunKey()
    api.create_node(ZONE, "upd", node_request(ssh_keys=first.metadata_entry(USER)))
    target, _ = _connect_target(api, host_backend, "upd")
    with pytest.raises(AuthError):
        Connection(target, second, connect_timeout=10).run("true", timeout=10)

    client = tpu_v2.TpuClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        transport="rest",
        client_options=ClientOptions(api_endpoint=emulator.url),
    )
    name = f"projects/{PROJECT}/locations/{ZONE}/nodes/upd"
    node = client.get_node(name=name)
    node.metadata["ssh-keys"] += "\n" + second.metadata_entry(USER)
    node.labels["outside-the-mask"] = "ignored"
    operation = client.update_node(
        node=node, update_mask=field_mask_pb2.FieldMask(paths=["metadata"])
    )
    assert operation.metadata.verb == "update"
    updated = operation.result(timeout=20)  # type: ignore[no-untyped-call]
    assert updated.name == name
    assert second.metadata_entry(USER) in updated.metadata["ssh-keys"]
    assert "outside-the-mask" not in updated.labels
    assert updated.state == tpu_v2.Node.State.READY

    deadline = time.monotonic() + 10
    while True:  # the host re-reads ssh-keys within a tick or two of the operation
        try:
            with Connection(target, second, connect_timeout=10) as connection:
                assert connection.run("echo new", timeout=20, check=True).stdout == "new\n"
            break
        except AuthError:
            assert time.monotonic() < deadline, "the SSH host never took the new key"
            time.sleep(0.1)
    with Connection(target, first, connect_timeout=10) as connection:
        assert connection.run("echo old", timeout=20, check=True).stdout == "old\n"

    with pytest.raises(BadRequest, match="updateMask"):
        client.update_node(
            node=node, update_mask=field_mask_pb2.FieldMask(paths=["runtime_version"])
        )
