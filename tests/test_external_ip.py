"""A node without an external IP: stop before SSH with what to do, or --internal-ip.

The emulator's `no_external_ips` fault plays an organisation policy that strips external
IPs. Without --internal-ip the run must fail right after READY (not after the host-key
and SSH timeouts) saying why, and still delete the node; with it, the run creates the
node without an external IP and connects to the internal address.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tpulab.errors import RemoteError
from tpulab.run.progress import Phase

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


def test_no_external_ip_fails_fast_with_the_reason_and_deletes_the_node(
    embedded_rig: Rig,
) -> None:
    embedded_rig.emulator.faults.no_external_ips = True
    life, recorder, error = embedded_rig.run(embedded_rig.spec())
    assert isinstance(error, RemoteError), error
    assert "no external IP" in error.message
    assert "--internal-ip" in (error.hint or "")
    # Right after READY: no host-key wait, no SSH attempt.
    assert [record.phase for record in recorder.phases][-2:] == [Phase.WAIT_READY, Phase.TEARDOWN]
    assert embedded_rig.emulator.calls["get_guest_attributes"] == 0
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_internal_ip_creates_without_an_external_ip_and_connects_inside(rig: Rig) -> None:
    spec = dataclasses.replace(rig.spec(), internal_ip=True)
    life, _, error = rig.run(spec)
    assert error is None, error
    assert life.outcome.succeeded
    created = [
        r
        for r in rig.emulator.requests()
        if r["method"] == "POST" and any(name == "nodeId" for name, _ in r["query"])
    ]
    assert created, "the create request was not logged"
    # enableExternalIps false is proto3's default: the REST transport sends {}.
    assert created[0]["body"]["networkConfig"] == {}
    assert rig.leftovers() == []
