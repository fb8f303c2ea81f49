"""The `ensurepip_missing` fault travels from the emulator's FaultPlan (set in-process or
as JSON over the admin endpoint) to the SSH host of the next node that becomes READY:
its python3 refuses `-m venv` as Ubuntu does without python3-venv."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from tpulab.cloud.polling import wait_for_state
from tpulab.models import NodeState
from tpulab.remote.ssh import Connection, RunKey, SshTarget, ssh_port_from, wait_for_host_key

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

pytest_plugins = ["emulator_fixtures", "ssh_fixtures"]

ZONE = "us-central1-a"
USER = "tpulab"


def test_ensurepip_missing_fault_reaches_the_node(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for, node_request
    from ssh_fixtures import login_user

    from tpulab.emulator.backends import make_host_backend

    backend = make_host_backend("embedded", tmp_path / "hosts")  # bare
    try:
        emulator = start_emulator(tmp_path / "state", host_backend=backend)
        request = urllib.request.Request(
            f"{emulator.url}/_emulator/faults",
            data=json.dumps({"ensurepip_missing": True}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["ensurepip_missing"] is True
        api = api_for(emulator)
        key = RunKey()
        api.create_node(ZONE, "no-venv", node_request(ssh_keys=key.metadata_entry(USER)))
        node = wait_for_state(api, ZONE, "no-venv", {NodeState.READY}, timeout=20)
        attributes: dict[str, str] = {}

        def fetch() -> dict[str, str]:
            attributes.update(api.guest_attributes(ZONE, "no-venv"))
            return dict(attributes)

        host_key = wait_for_host_key(fetch, timeout=20)
        node = api.get_node(ZONE, "no-venv")  # the address may follow READY by a tick
        assert node.external_ip is not None
        target = SshTarget(
            node.external_ip, ssh_port_from(attributes), login_user(backend, USER), host_key
        )
        with Connection(target, key, connect_timeout=20) as connection:
            refused = connection.run(["python3", "-m", "venv", "v"], timeout=60)
            without_pip = connection.run(
                ["python3", "-m", "venv", "--without-pip", "w"], timeout=60
            )
            named = connection.run(["sh", "-c", 'printf %s "$TPULAB_EMULATED_IMAGE"'], timeout=20)
    finally:
        backend.close()
    assert refused.exit_status != 0
    assert "ensurepip is not\navailable" in refused.stdout
    assert "apt install python3.10-venv" in refused.stdout
    assert without_pip.exit_status == 0, without_pip.stderr
    assert named.stdout.startswith("bare (python3 ")
    assert named.stdout.endswith(", without ensurepip")
