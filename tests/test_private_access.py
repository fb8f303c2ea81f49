"""--internal-ip needs Private Google Access on the VM's subnetwork, and a bootstrap that
cannot reach its downloads says so in seconds.

Private Google Access (Compute v1 `Subnetwork.privateIpGoogleAccess`) is off on the
subnetworks `--subnet-mode auto` creates, so the emulator's are off too unless the
`private_google_access` fault turns them on. `tpulab doctor --internal-ip` reports it;
`run --internal-ip` refuses a definite "off" with exit 2 before any create.
The `package_index_unreachable` fault gives a booting node download sources at a closed
port, as a VM without an external IP and without Cloud NAT has none it can reach.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING

import requests
from helpers import tpulab

from tpulab.app.doctor import run_preflight
from tpulab.cloud.preflight import refuse_on_problems

if TYPE_CHECKING:
    from pathlib import Path

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"
SUBNETWORK_PATH = f"/compute/v1/projects/{PROJECT}/regions/us-central1/subnetworks/default"
ENABLE = (
    f"gcloud compute networks subnets update default --project {PROJECT} --region "
    "us-central1 --enable-private-ip-google-access"
)
# Doctor and the preflight only read: any POST but these two reads would be a change.
_READS = re.compile(r"^/(v1/projects/[^/]+(:testIamPermissions|:getIamPolicy)|tokeninfo)$")


def _doctor(emulator: Emulator, *extra: str) -> tuple[int, str]:
    done = tpulab(
        "doctor", "--api-endpoint", emulator.url, "--project", PROJECT, "--zone", ZONE, *extra
    )
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def _created_nothing(emulator: Emulator) -> None:
    assert emulator.calls["create_node"] == 0
    assert emulator.calls["create_queued_resource"] == 0
    for request in emulator.requests():
        assert request["method"] == "GET" or _READS.match(request["path"]), request
    assert emulator.node_names() == []


def test_the_emulator_serves_auto_mode_subnetworks_with_private_access_off(
    emulator: Emulator,
) -> None:
    network = requests.get(
        f"{emulator.url}/compute/v1/projects/{PROJECT}/global/networks/default", timeout=10
    ).json()
    regions = [link.split("/regions/")[1].split("/")[0] for link in network["subnetworks"]]
    assert "us-central1" in regions
    assert "europe-west4" in regions
    subnet = requests.get(emulator.url + SUBNETWORK_PATH, timeout=10).json()
    assert subnet["privateIpGoogleAccess"] is False
    assert subnet["ipCidrRange"] == "10.128.0.0/20"
    assert subnet["network"].endswith(f"/projects/{PROJECT}/global/networks/default")
    emulator.faults.update({"private_google_access": True})
    assert requests.get(emulator.url + SUBNETWORK_PATH, timeout=10).json()["privateIpGoogleAccess"]
    missing = requests.get(emulator.url + SUBNETWORK_PATH.replace("default", "nope"), timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["errors"][0]["reason"] == "notFound"


def test_doctor_internal_ip_reports_private_access_off_with_both_fixes(
    emulator: Emulator,
) -> None:
    status, output = _doctor(emulator, "--internal-ip")

    assert status == 3, output
    assert "problem private-access" in output
    assert "has Private Google Access off" in output
    assert ENABLE in output
    assert "gcloud compute routers nats create tpulab-nat" in output
    assert "--python system with a package mirror" in output
    assert emulator.calls["get_subnetwork"] == 1
    _created_nothing(emulator)


def test_doctor_internal_ip_is_ok_when_the_subnetwork_has_private_access(
    emulator: Emulator,
) -> None:
    emulator.faults.update({"private_google_access": True})

    status, output = _doctor(emulator, "--internal-ip")

    assert status == 0, output
    assert "ok private-access Subnetwork `default` (us-central1) has Private Google" in output
    # The subnetwork was read (not assumed), the one of the zone's region.
    asked = [r["path"] for r in emulator.requests() if "/subnetworks/" in r["path"]]
    assert asked == [SUBNETWORK_PATH]
    _created_nothing(emulator)


def test_doctor_reads_the_given_subnetwork_in_its_own_region(emulator: Emulator) -> None:
    given = f"projects/{PROJECT}/regions/europe-west4/subnetworks/default"

    status, output = _doctor(emulator, "--internal-ip", "--subnetwork", given)

    assert status == 3, output
    assert "--region europe-west4 --enable-private-ip-google-access" in output
    asked = [r["path"] for r in emulator.requests() if "/subnetworks/" in r["path"]]
    assert asked == [f"/compute/v1/{given}"]
    # Without --internal-ip nothing is asked of subnetworks.
    emulator.clear_requests()
    status, output = _doctor(emulator)
    assert status == 0, output
    assert "private-access" not in output
    assert not [r for r in emulator.requests() if "/subnetworks/" in r["path"]]


def test_a_subnetwork_compute_will_not_show_is_unknown_and_does_not_refuse(
    emulator: Emulator,
) -> None:
    from tpulab.cloud.network_checks import Placement

    emulator.faults.update({"transient": {"get_subnetwork": 1}})
    checks = run_preflight(PROJECT, api_endpoint=emulator.url, internal_ip=Placement(ZONE))

    assert [(c.name, c.status) for c in checks][-1] == ("private-access", "unknown")
    assert "HTTP 503" in checks[-1].summary
    refuse_on_problems(checks)  # unknown decides nothing: the run proceeds


def test_run_with_internal_ip_refuses_private_access_off_before_the_create(
    emulator: Emulator,
) -> None:
    done = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        "--project", PROJECT, "--zone", ZONE, "--internal-ip",
    )  # fmt: skip
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert "has Private Google Access off" in said
    assert ENABLE in said
    assert "tpulab doctor" in said
    _created_nothing(emulator)


def test_the_run_preflight_asks_private_access_only_for_internal_ip(emulator: Emulator) -> None:
    from tpulab.cloud.network_checks import Placement

    emulator.faults.update({"private_google_access": True})
    checks = run_preflight(PROJECT, api_endpoint=emulator.url, internal_ip=Placement(ZONE))
    assert [(c.name, c.status) for c in checks] == [
        ("tpu-api", "ok"),
        ("permissions", "ok"),
        ("private-access", "ok"),
    ]
    paths = [r["path"] for r in emulator.requests()]
    assert paths[2:] == [f"/compute/v1/projects/{PROJECT}/global/networks/default", SUBNETWORK_PATH]
    emulator.clear_requests()
    assert len(run_preflight(PROJECT, api_endpoint=emulator.url)) == 2
    assert not [r for r in emulator.requests() if "/compute/" in r["path"]]


def test_the_dry_run_shows_the_subnetwork_read() -> None:
    done = tpulab(
        "run", "--accelerator", "v5litepod-4", "--project", PROJECT, "--zone", ZONE,
        "--internal-ip", "--dry-run", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout)["steps"]
    reads = [step for step in steps if "/subnetworks/" in (step.get("path") or "")]
    assert [step["path"] for step in reads] == [
        "/compute/v1/projects/test-project/regions/us-central1/subnetworks/default"
    ]
    assert reads[0]["method"] == "GET"


def test_a_vm_that_cannot_reach_its_index_fails_at_bootstrap_in_seconds_and_is_deleted(
    fast_embedded_emulator: Path,
) -> None:
    from emulator_fixtures import embedded_nodes_left

    (fast_embedded_emulator / "faults.json").write_text(
        json.dumps({"package_index_unreachable": True})
    )
    started = time.monotonic()
    done = tpulab("run", "--emulate", "--accelerator", "v5litepod-4", "--json")
    took = time.monotonic() - started

    document = json.loads(done.stdout)
    assert done.returncode != 0, document
    message = document["error"]["message"]
    assert re.search(r"The VM cannot reach http://127\.0\.0\.1:\d+/simple", message), message
    assert "stopped before downloading" in message
    assert "Cloud NAT" in (document["error"]["hint"] or "")
    bootstrap = [p for p in document["phases"] if p["phase"] == "bootstrap"]
    assert bootstrap
    assert bootstrap[0]["ok"] is False
    assert bootstrap[0]["seconds"] < 15, bootstrap
    assert took < 90
    assert embedded_nodes_left() == []
