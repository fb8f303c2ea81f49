"""The emulator's Compute Engine instances API for TPU machine types (emulator/instances.py):
gcloud as a real client, real SSH hosts behind RUNNING instances, Compute's fault shapes,
spot preemption, the VM's own token deleting its instance, and the Cloud TPU API and
Compute not seeing each other's resources."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import require_tool

from tpulab.remote.ssh import Connection, HostKey, RunKey, SshTarget

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter
    from helpers import FakeClock

    from tpulab.emulator import Emulator
    from tpulab.emulator.hosts import HostBackend

pytest_plugins = ["emulator_fixtures", "ssh_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"
USER = "tpulab"
TPU_TYPE = "ct6e-standard-4t"


def _call(
    emulator: Emulator, method: str, path: str, body: dict[str, Any] | None = None, token: str = ""
) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{emulator.url}/compute/v1/projects/{PROJECT}/{path}", data=data, method=method
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read())


def _insert(emulator: Emulator, name: str, **extra: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "machineType": f"zones/{ZONE}/machineTypes/{extra.pop('machine_type', TPU_TYPE)}",
        "disks": [{"boot": True, "initializeParams": {"sourceImage": "x/family/tpu-vm"}}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        **extra,
    }
    status, operation = _call(emulator, "POST", f"zones/{ZONE}/instances", body)
    assert status == 200, operation
    return operation


def test_host_keys_are_published_only_where_guest_attributes_are_enabled(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    _wait(emulator, _insert(emulator, "plain"))
    _wait(
        emulator,
        _insert(
            emulator,
            "enabled",
            metadata={"items": [{"key": "enable-guest-attributes", "value": "TRUE"}]},
        ),
    )

    def attributes(name: str, query: str) -> tuple[int, dict[str, Any]]:
        return _call(
            emulator, "GET", f"zones/{ZONE}/instances/{name}/getGuestAttributes?queryPath={query}"
        )

    _until(lambda: attributes("enabled", "hostkeys/")[0] == 200)
    _, found = attributes("enabled", "hostkeys/")
    assert {i["key"] for i in found["queryValue"]["items"]} >= {"ssh-ed25519"}
    # The emulator's port is there either way; the agent's host keys are not.
    _until(lambda: attributes("plain", "tpulab-emulator/")[0] == 200)
    status, refused = attributes("plain", "hostkeys/")
    assert status == 404
    assert refused["error"]["message"] == (
        "The resource 'hostkeys/' of type 'Guest Attribute' was not found."
    )


def _wait(emulator: Emulator, operation: dict[str, Any]) -> dict[str, Any]:
    status, done = _call(emulator, "POST", f"zones/{ZONE}/operations/{operation['name']}/wait")
    assert status == 200, done
    assert done["status"] == "DONE"
    return done


def _status_of(emulator: Emulator, name: str) -> str:
    status, instance = _call(emulator, "GET", f"zones/{ZONE}/instances/{name}")
    return str(instance["status"]) if status == 200 else f"HTTP {status}"


def _until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _gcloud_env(emulator: Emulator, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
    env.update(
        CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE=emulator.url + "/compute/v1/",
        CLOUDSDK_AUTH_DISABLE_CREDENTIALS="true",
        CLOUDSDK_CORE_PROJECT=PROJECT,
        CLOUDSDK_CONFIG=str(config),
        CLOUDSDK_CORE_DISABLE_PROMPTS="1",
        CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
        CLOUDSDK_CORE_DISABLE_USAGE_REPORTING="true",
    )
    return env


@pytest.mark.longest
@pytest.mark.gcloud
def test_gcloud_creates_lists_describes_and_deletes_a_tpu_instance_that_is_an_ssh_host(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    from emulator_fixtures import api_for
    from ssh_fixtures import login_user

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    env = _gcloud_env(emulator, tmp_path / "gcloud-config")

    def gcloud(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["gcloud", "compute", "instances", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    key = RunKey()
    created = gcloud(
        "create",
        "gc-vm",
        f"--zone={ZONE}",
        f"--machine-type={TPU_TYPE}",
        "--image-family=tpu-vm-ubuntu-2204",
        "--image-project=cloud-tpu-images",
        "--labels=managed-by=tpulab,tpulab-run=gc-1",
        f"--metadata=ssh-keys={key.metadata_entry(USER)},enable-guest-attributes=TRUE",
    )
    assert created.returncode == 0, created.stderr
    assert f"/zones/{ZONE}/instances/gc-vm" in created.stderr

    described = gcloud("describe", "gc-vm", f"--zone={ZONE}", "--format=json")
    assert described.returncode == 0, described.stderr
    instance = json.loads(described.stdout)
    assert instance["status"] == "RUNNING"
    assert instance["machineType"].endswith(f"/zones/{ZONE}/machineTypes/{TPU_TYPE}")
    assert instance["labels"] == {"managed-by": "tpulab", "tpulab-run": "gc-1"}

    listed = gcloud("list", "--filter=labels.tpulab-run=gc-1", "--format=value(name,status)")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["gc-vm", "RUNNING"]
    # The Cloud TPU API does not see a Compute instance.
    assert api_for(emulator).list_nodes(ZONE) == []

    # The host key and SSH port, as the guest agent publishes them; the key from
    # ssh-keys logs in, the host key pinned.
    def published() -> bool:
        return (
            _call(
                emulator,
                "GET",
                f"zones/{ZONE}/instances/gc-vm/getGuestAttributes?queryPath=hostkeys/",
            )[0]
            == 200
        )

    _until(published)
    _, keys = _call(
        emulator,
        "GET",
        f"zones/{ZONE}/instances/gc-vm/getGuestAttributes?variableKey=hostkeys/ssh-ed25519",
    )
    _, port = _call(
        emulator,
        "GET",
        f"zones/{ZONE}/instances/gc-vm/getGuestAttributes?queryPath=tpulab-emulator/ssh-port",
    )
    [port_item] = port["queryValue"]["items"]
    target = SshTarget(
        instance["networkInterfaces"][0]["networkIP"],
        int(port_item["value"]),
        login_user(host_backend, USER),
        HostKey("ssh-ed25519", keys["variableValue"]),
    )
    with Connection(target, key, connect_timeout=20) as connection:
        result = connection.run("pwd", timeout=20, check=True)
    home = emulator.instance_home(PROJECT, ZONE, "gc-vm")
    assert Path(result.stdout.strip()).resolve() == home.resolve()

    deleted = gcloud("delete", "gc-vm", f"--zone={ZONE}", "--quiet")
    assert deleted.returncode == 0, deleted.stderr
    assert emulator.instance_names() == []
    _until(lambda: not home.exists())
    missing = gcloud("describe", "gc-vm", f"--zone={ZONE}")
    assert missing.returncode != 0
    assert "was not found" in missing.stderr

    refused = gcloud("create", "cpu-vm", f"--zone={ZONE}", "--machine-type=n2-standard-8")
    assert refused.returncode != 0
    assert "Machine type with name 'n2-standard-8' does not exist" in refused.stderr


def test_statuses_run_provisioning_staging_running_stopping_then_gone(
    held_emulator: tuple[Emulator, FakeClock],
) -> None:
    emulator, clock = held_emulator  # time moves only when the test moves it
    create = emulator.timing.create_seconds
    operation = _insert(emulator, "flow")
    assert operation["status"] == "RUNNING"
    assert operation["operationType"] == "insert"
    assert _status_of(emulator, "flow") == "PROVISIONING"
    clock.now += create * 0.6
    assert _status_of(emulator, "flow") == "STAGING"
    clock.now += create * 0.5
    assert _status_of(emulator, "flow") == "RUNNING"
    assert "error" not in _wait(emulator, operation)

    _, deleting = _call(emulator, "DELETE", f"zones/{ZONE}/instances/flow")
    assert deleting["operationType"] == "delete"
    assert _status_of(emulator, "flow") == "STOPPING"
    clock.now += emulator.timing.delete_seconds
    assert _wait(emulator, deleting)["status"] == "DONE"
    assert _status_of(emulator, "flow") == "HTTP 404"


def test_stockout_quota_permission_and_bad_type_in_computes_shapes(emulator: Emulator) -> None:
    emulator.faults.stockout_zones = [ZONE]
    done = _wait(emulator, _insert(emulator, "no-room"))
    [error] = done["error"]["errors"]
    assert error["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert error["message"].startswith(
        f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources"
    )
    assert done["httpErrorStatusCode"] == 503
    assert emulator.instance_names() == []  # nothing was made

    emulator.faults.stockout_zones = []
    emulator.faults.quota_regions = ["us-central1"]
    done = _wait(emulator, _insert(emulator, "no-quota"))
    [error] = done["error"]["errors"]
    assert error["code"] == "QUOTA_EXCEEDED"
    assert error["message"].endswith("Limit: 0.0 in region us-central1.")
    assert error["errorDetails"][0]["quotaInfo"]["dimensions"] == {"region": "us-central1"}
    assert emulator.instance_names() == []

    emulator.faults.quota_regions = []
    emulator.faults.caller_lacks = ["compute.instances.create"]
    status, body = _call(
        emulator, "POST", f"zones/{ZONE}/instances", {"name": "x", "machineType": TPU_TYPE}
    )
    assert status == 403
    assert body["error"]["errors"][0]["reason"] == "forbidden"
    assert body["error"]["message"] == (
        "Required 'compute.instances.create' permission for "
        f"'projects/{PROJECT}/zones/{ZONE}/instances/x'"
    )

    emulator.faults.caller_lacks = []
    emulator.faults.disabled_services = ["compute.googleapis.com"]
    status, body = _call(emulator, "GET", f"zones/{ZONE}/instances")
    assert status == 403
    assert body["error"]["errors"][0]["reason"] == "accessNotConfigured"
    assert body["error"]["message"].startswith("Compute Engine API has not been used in project")

    emulator.faults.disabled_services = []
    status, body = _call(
        emulator, "POST", f"zones/{ZONE}/instances", {"name": "x", "machineType": "v6e-4"}
    )
    assert status == 400
    assert body["error"]["errors"][0]["reason"] == "invalid"


@pytest.mark.parametrize(
    ("lacked", "body_extra"),
    [
        ("compute.disks.create", {}),
        ("compute.subnetworks.use", {}),
        (
            "compute.subnetworks.useExternalIp",
            {"networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}]},
        ),
        ("compute.instances.setMetadata", {"metadata": {"items": [{"key": "k", "value": "v"}]}}),
        ("compute.instances.setLabels", {"labels": {"managed-by": "tpulab"}}),
        ("compute.instances.setServiceAccount", {"serviceAccounts": [{"email": "default"}]}),
    ],
)
def test_an_insert_needs_every_permission_its_request_uses(
    emulator: Emulator, lacked: str, body_extra: dict[str, Any]
) -> None:
    """Holding compute.instances.create is not enough, as on Compute: a caller without
    the permission for the disk, the subnetwork or a field the insert sets is refused
    with that permission named, and nothing is made. Without the field, the insert needs
    no such permission (labels, metadata, an external IP, a service account are asked
    only when set)."""
    emulator.faults.caller_lacks = [lacked]
    body = {"name": "needs", "machineType": TPU_TYPE, **body_extra}
    status, answer = _call(emulator, "POST", f"zones/{ZONE}/instances", body)
    assert status == 403, answer
    assert answer["error"]["message"] == (
        f"Required '{lacked}' permission for 'projects/{PROJECT}/zones/{ZONE}/instances/needs'"
    )
    assert emulator.instance_names() == []
    if body_extra:  # the same insert without that field goes through
        done = _wait(emulator, _insert(emulator, "bare", networkInterfaces=[{}]))
        assert "error" not in done, done
        assert emulator.instance_names() == ["bare"]


def test_a_node_and_an_instance_of_one_name_do_not_see_each_other(emulator: Emulator) -> None:
    from emulator_fixtures import api_for, node_request

    api = api_for(emulator)
    api.wait_operation(api.create_node(ZONE, "twin", node_request()), timeout=20)
    _wait(emulator, _insert(emulator, "twin", labels={"side": "compute"}))

    assert [n.name for n in api.list_nodes(ZONE)] == ["twin"]
    assert emulator.node_names() == ["twin"]
    assert emulator.instance_names() == ["twin"]
    _, listed = _call(emulator, "GET", f"zones/{ZONE}/instances")
    assert [i["labels"] for i in listed["items"]] == [{"side": "compute"}]

    _wait(emulator, _call(emulator, "DELETE", f"zones/{ZONE}/instances/twin")[1])
    assert emulator.instance_names() == []
    assert api.get_node(ZONE, "twin").name == "twin"


def test_list_filters_on_labels_and_pages(emulator: Emulator) -> None:
    for index in range(3):
        _insert(emulator, f"vm-{index}", labels={"run": "a" if index < 2 else "b"})
    _, only_a = _call(emulator, "GET", f"zones/{ZONE}/instances?filter=labels.run%20%3D%20%22a%22")
    assert [i["name"] for i in only_a["items"]] == ["vm-0", "vm-1"]
    _, both = _call(
        emulator,
        "GET",
        f"zones/{ZONE}/instances?filter=(labels.run%20%3D%20a)%20(name%20!%3D%20vm-0)",
    )
    assert [i["name"] for i in both["items"]] == ["vm-1"]

    names: list[str] = []
    token = ""
    while True:
        _, page = _call(emulator, "GET", f"zones/{ZONE}/instances?maxResults=2&pageToken={token}")
        names += [i["name"] for i in page["items"]]
        token = page.get("nextPageToken", "")
        if not token:
            break
    assert names == ["vm-0", "vm-1", "vm-2"]
    status, _ = _call(emulator, "GET", f"zones/{ZONE}/instances?filter=labels.run%20~%20a")
    assert status == 400


@pytest.mark.parametrize(("action", "after"), [("STOP", "TERMINATED"), ("DELETE", "HTTP 404")])
def test_a_preempted_spot_instance_stops_or_is_deleted(
    emulator: Emulator, action: str, after: str
) -> None:
    emulator.faults.preempt_after = 0.2
    _wait(
        emulator,
        _insert(
            emulator,
            "spot",
            scheduling={"provisioningModel": "SPOT", "instanceTerminationAction": action},
        ),
    )
    _until(lambda: _status_of(emulator, "spot") == after)


def _metadata_token(emulator: Emulator, name: str) -> str:
    record = next(
        r
        for r in emulator.snapshot()["nodes"].values()
        if r.get("api") == "compute" and r["name"] == name
    )
    address = (record.get("guest") or {})["metadata"]
    request = urllib.request.Request(
        f"http://{address}/computeMetadata/v1/instance/service-accounts/default/token",
        headers={"Metadata-Flavor": "Google"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(json.loads(answer.read())["access_token"])


def test_the_vms_own_token_deletes_its_instance_unless_its_identity_may_not(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    emulator = start_emulator(tmp_path / "state", guests=True)
    # The startup-script runs at boot, in the VM's home, beside its metadata server.
    script = 'echo "booted as $(hostname -s 2>/dev/null || echo vm)" > "$HOME/booted.txt"'
    metadata = {"items": [{"key": "startup-script", "value": script}]}
    for name in ("self-a", "self-b"):
        _wait(emulator, _insert(emulator, name, metadata=metadata))
    booted = emulator.instance_home(PROJECT, ZONE, "self-a") / "booted.txt"
    _until(booted.exists)
    assert emulator.skip_vm_clock(PROJECT, ZONE, "self-a", 5.0, instance=True) == 5.0
    _until(
        lambda: (
            all(
                (r.get("guest") or {}).get("metadata")
                for r in emulator.snapshot()["nodes"].values()
            )
            and len(emulator.instance_names()) == 2
        )
    )

    def may_delete(token: str) -> list[str]:
        """Resource Manager testIamPermissions with the VM's token, as the watchdog asks."""
        request = urllib.request.Request(
            f"{emulator.url}/v1/projects/{PROJECT}:testIamPermissions",
            data=json.dumps({"permissions": ["compute.instances.delete"]}).encode(),
            headers={"Authorization": f"Bearer {token}"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return list(json.loads(answer.read()).get("permissions", []))

    assert may_delete(_metadata_token(emulator, "self-b")) == ["compute.instances.delete"]
    emulator.faults.node_identity_cannot_delete = True
    token = _metadata_token(emulator, "self-b")
    assert may_delete(token) == []
    status, body = _call(emulator, "DELETE", f"zones/{ZONE}/instances/self-b", token=token)
    assert status == 403
    assert "compute.instances.delete" in body["error"]["message"]

    emulator.faults.node_identity_cannot_delete = False
    token = _metadata_token(emulator, "self-a")
    status, operation = _call(emulator, "DELETE", f"zones/{ZONE}/instances/self-a", token=token)
    assert status == 200, operation
    _wait(emulator, operation)
    assert emulator.instance_names() == ["self-b"]
    caller = [r.get("caller") for r in emulator.requests() if r["method"] == "DELETE"]
    assert caller[-1] is not None


def test_a_restarted_emulator_boots_running_instances_again(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = start_emulator(state, guests=True)
    _wait(first, _insert(first, "kept"))

    def boot(emulator: Emulator) -> tuple[str, str]:
        """(the emulator that booted it, its metadata server's address)"""
        [record] = [r for r in emulator.snapshot()["nodes"].values() if r.get("api")]
        owner = str((record.get("host") or {}).get("owner") or "")
        return owner, str((record.get("guest") or {}).get("metadata") or "")

    _until(lambda: all(boot(first)))
    booted_by, old_address = boot(first)
    first.stop()

    second = start_emulator(state, guests=True)
    # A new boot: another owner, and a metadata server of its own (the old record of the
    # guest stays until the new guest replaces it).
    _until(lambda: boot(second)[0] not in {"", booted_by} and boot(second)[1] != old_address)
    assert _status_of(second, "kept") == "RUNNING"
    assert _metadata_token(second, "kept").startswith("ya29.")


@pytest.mark.gcloud
def test_gcloud_compute_ssh_adds_its_key_and_pins_the_published_host_key(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    """`gcloud compute ssh` (command_lib/compute/ssh_utils.py): it reads the instance and
    the project, adds its own key with instances.setMetadata (the fingerprint lock), reads
    the host keys from guest attributes and runs the system ssh, host key checked."""
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")
    from ssh_fixtures import login_user

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    enabled = {"items": [{"key": "enable-guest-attributes", "value": "TRUE"}]}
    nat = [{"network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}]
    _wait(emulator, _insert(emulator, "gc-ssh", metadata=enabled, networkInterfaces=nat))

    def port() -> int:
        status, found = _call(
            emulator,
            "GET",
            f"zones/{ZONE}/instances/gc-ssh/getGuestAttributes?variableKey=tpulab-emulator/ssh-port",
        )
        return int(found["variableValue"]) if status == 200 else 0

    _until(lambda: port() > 0)
    home = tmp_path / "home"
    home.mkdir()
    env = {**_gcloud_env(emulator, home / "gcloud-config"), "HOME": str(home)}
    env["CLOUDSDK_CORE_ACCOUNT"] = "tester@example.com"
    user = login_user(host_backend, "tester")
    ran = subprocess.run(
        [
            "gcloud",
            "compute",
            "ssh",
            f"{user}@gc-ssh",
            f"--zone={ZONE}",
            "--command=echo ok from $HOME",
            f"--ssh-flag=-p {port()}",
            "--strict-host-key-checking=yes",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    # (ssh-keygen's report comes first: gcloud made its key in this HOME.)
    home_there = emulator.instance_home(PROJECT, ZONE, "gc-ssh")
    assert ran.stdout.strip().splitlines()[-1] == f"ok from {home_there}"
    _, instance = _call(emulator, "GET", f"zones/{ZONE}/instances/gc-ssh")
    keys = {i["key"]: i["value"] for i in instance["metadata"]["items"]}["ssh-keys"]
    assert keys.startswith(f"{user}:ssh-rsa ")  # gcloud's own key, added by setMetadata
    calls = [f"{r['method']} {r['path'].rsplit('/', 1)[-1]}" for r in emulator.requests()]
    assert "POST setMetadata" in calls
    assert "GET getGuestAttributes" in calls


def test_set_metadata_needs_the_current_fingerprint(emulator: Emulator) -> None:
    _wait(emulator, _insert(emulator, "meta"))
    _, instance = _call(emulator, "GET", f"zones/{ZONE}/instances/meta")
    stale = instance["metadata"]["fingerprint"]
    path = f"zones/{ZONE}/instances/meta/setMetadata"
    items = [{"key": "ssh-keys", "value": "a:ssh-ed25519 AAAA a"}]

    status, operation = _call(emulator, "POST", path, {"fingerprint": stale, "items": items})
    assert status == 200, operation
    assert _wait(emulator, operation)["operationType"] == "setMetadata"
    _, instance = _call(emulator, "GET", f"zones/{ZONE}/instances/meta")
    assert instance["metadata"]["items"] == items
    assert instance["metadata"]["fingerprint"] != stale

    status, refused = _call(emulator, "POST", path, {"fingerprint": stale, "items": []})
    assert status == 412
    assert refused["error"]["errors"][0]["reason"] == "conditionNotMet"
