"""The VM-side paths of remote_payloads/watchdog.py that the happy path never reaches:
preemption passed on, the first boot remembered across a reboot, the queued resource's
delete proven at boot, a DELETE refused for good, a metadata server that is not up yet,
and the watchdog's own restart after a crash. Each runs the real startup-script and the
real daemon against test_watchdog_script's FakeCloud (a real HTTP server).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from helpers import wait_until
from test_watchdog_script import (
    LATE,
    NODE,
    PROJECT,
    SERVICE_ACCOUNT,
    Armed,
    FakeCloud,
    _config,
    armed,
    cloud,
)

from tpulab.contract import DELETE_QUEUED_RESOURCE_PERMISSION, PREEMPTED_ATTRIBUTE
from tpulab.remote.watchdog import parse_state

__all__ = ["armed", "cloud"]  # the fixtures, shared with test_watchdog_script

QUEUED_DELETE = "tpu.queuedresources.delete"


def _boot(armed: list[Armed], one: Armed) -> Armed:
    armed.append(one)
    return one


def _first_boot_file(dog: Armed) -> Path:
    return dog.disk / "var/lib/tpulab" / f"first-boot-{dog.config.run_id}"


# -- preemption ---------------------------------------------------------------------------


def test_preemption_is_published_once_and_deletes_nothing(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    dog = _boot(armed, Armed(_config("9e1a01", boot_grace_seconds=60.0), address))
    wait_until(lambda: state.states() == ["armed"], "the watchdog armed")
    # Two polls that read FALSE (counted as the server answers them, not slept for): a
    # spot VM not preempted says nothing.
    looked = state.reads("instance/preempted")
    wait_until(
        lambda: (
            state.reads("instance/preempted") >= looked + 2 or state.attribute(PREEMPTED_ATTRIBUTE)
        ),
        "two more polls",
    )
    assert state.attribute(PREEMPTED_ATTRIBUTE) == []
    state.preempted = "TRUE"
    wait_until(lambda: state.attribute(PREEMPTED_ATTRIBUTE), "tpulab/preempted")
    # Three more polls, each seeing TRUE again, marked by renewals: a poll looks at
    # instance/preempted first and publishes a renewal it sees last.
    for renewal in (1, 2, 3):
        dog.renew()
        wait_until(_renewal_published(state, renewal), f"renewal {renewal} published")
    assert state.attribute(PREEMPTED_ATTRIBUTE) == ["TRUE"], "published once"
    assert state.deletes() == [], "the VM is going anyway: the laptop recovers"
    assert state.states() == ["armed"]
    assert dog.alive()


def _renewal_published(state: FakeCloud, renewal: int) -> Callable[[], bool]:
    """Has the watchdog published its lease (tpulab/lease) with `renewal` renewals?"""

    def published() -> bool:
        return any(lease.renewals >= renewal for lease in state.leases())

    return published


# -- the first boot, remembered ------------------------------------------------------------


def test_a_reboot_keeps_the_first_boots_deadline(
    cloud: tuple[FakeCloud, str], armed: list[Armed], tmp_path: Path
) -> None:
    state, address = cloud
    disk, skip = tmp_path / "disk", tmp_path / "clock-skip"
    config = _config("b0071a", lease_seconds=2.0, max_duration_seconds=48.0)
    first = _boot(armed, Armed(config, address, disk=disk, clock_skip=skip))
    wait_until(lambda: state.states() == ["armed"], "the first boot armed")
    remembered = json.loads(_first_boot_file(first).read_text())["first_boot"]
    assert abs(remembered - time.time()) < 30
    first.power_off()
    # 45 s pass on the VM's clock before it is up again: 3 s of the deadline are left.
    skip.write_text("45.0\n")
    second = _boot(armed, Armed(config, address, disk=disk, clock_skip=skip))
    until = time.monotonic() + 60  # a bound: the deadline is ~3 s away, not 48
    while not state.deletes() and time.monotonic() < until:
        second.renew()
        time.sleep(0.3)
    assert state.deletes(), "the deadline never fired after the reboot"
    assert state.states()[-1] == "firing: deadline"
    # When, by the wall clock: 48 s after the first boot less the 45 s the reboot took,
    # i.e. 3 s after the first boot in real time (however long the reboot here took).
    to_wall = time.time() - time.monotonic()
    fired = state.deletes()[0].at + to_wall - remembered
    assert fired >= 3.0 - 0.1, fired
    # Not 48 s: the first boot's deadline. At most LATE after it, or after the second
    # boot began if this machine took longer than the 3 s to get there.
    rebooted = second.started + to_wall - remembered
    assert fired - max(3.0, rebooted) < LATE, (fired, rebooted)
    # The file still names the first boot: a third boot would count from it too.
    assert json.loads(_first_boot_file(first).read_text())["first_boot"] == remembered
    # Each boot says how long ago the first was, by its own clock: the first at once,
    # the second 45 s (the skip) plus the real time its boot began after the first (a
    # loaded CI machine took over 5 s: a "40-something" check failed at "50"), and the
    # time the second watchdog took to start and say it (20 s: a bound, not a timing).
    ago = [int(x) for x in re.findall(r"first boot (\d+)s ago", second.log())]
    assert len(ago) == 2, ago
    assert ago[0] < LATE, ago
    assert 45 + rebooted - 1 <= ago[1] <= 45 + rebooted + 20, (ago, rebooted)


def test_a_reboot_after_the_grace_gives_the_controller_one_lease_not_a_new_grace(
    cloud: tuple[FakeCloud, str], armed: list[Armed], tmp_path: Path
) -> None:
    state, address = cloud
    disk, skip = tmp_path / "disk", tmp_path / "clock-skip"
    config = _config("9ace0b", lease_seconds=2.0, boot_grace_seconds=30.0)
    first = _boot(armed, Armed(config, address, disk=disk, clock_skip=skip))
    wait_until(lambda: state.states() == ["armed"], "the first boot armed")
    first.power_off()
    skip.write_text("40.0\n")  # the 30 s grace ran out while the VM was down
    second = _boot(armed, Armed(config, address, disk=disk, clock_skip=skip))
    wait_until(lambda: state.deletes(), "the DELETE after the reboot", timeout=25)
    fired = state.deletes()[0].at
    rearmed = [r.at for r in state.requests if r.method == "PUT" and r.body == "armed"]
    assert len(rearmed) == 2, rearmed  # the first boot's, and the second's
    # One lease (2 s) for a live controller to renew over its new SSH session (from
    # before the second daemon armed; at most a poll and LATE after); a restarted grace
    # would be 30 s.
    assert fired - second.started >= 2.0, fired - second.started
    assert fired - rearmed[1] < 2.0 + LATE, fired - rearmed[1]
    assert state.states()[-1] == "firing: lease expired"
    # What the second boot published: one lease from its start, for other machines.
    assert 1.0 < state.leases()[-1].lease_seconds <= 2.0


def test_a_first_boot_that_cannot_be_remembered_still_guards(
    cloud: tuple[FakeCloud, str], armed: list[Armed], tmp_path: Path
) -> None:
    """A disk the watchdog cannot write (here: a file where its directory would be) is
    logged; this boot counts as the first and the watchdog fires on its grace as ever."""
    state, address = cloud
    disk = tmp_path / "disk"
    (disk / "var/lib").mkdir(parents=True)
    (disk / "var/lib/tpulab").write_text("not a directory")
    dog = _boot(armed, Armed(_config("d15c0f", boot_grace_seconds=1.0), address, disk=disk))
    wait_until(lambda: state.deletes(), "the DELETE")
    assert "cannot remember the first boot" in dog.log()
    assert state.states() == ["armed", "firing: lease expired"]


# -- the queued resource's delete, proven at boot ------------------------------------------


def test_a_queued_node_without_the_queued_delete_is_not_armed(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    assert DELETE_QUEUED_RESOURCE_PERMISSION == QUEUED_DELETE
    state.granted = ["tpu.nodes.delete"]
    config = dataclasses.replace(_config("40e0ed", boot_grace_seconds=60.0), queued_resource=NODE)
    _boot(armed, Armed(config, address))
    wait_until(lambda: state.states(), "a published state")
    iam = [r for r in state.requests if r.path.endswith(":testIamPermissions")]
    assert json.loads(iam[0].body) == {"permissions": ["tpu.nodes.delete", QUEUED_DELETE]}
    parsed = parse_state(state.states()[0])
    assert parsed.kind == "no-permission"
    assert not parsed.armed
    assert f"{SERVICE_ACCOUNT} lacks {QUEUED_DELETE} on project {PROJECT}" in parsed.detail
    assert "lacks tpu.nodes.delete" not in parsed.detail  # it holds that one
    fix = parsed.fix(SERVICE_ACCOUNT)
    assert fix is not None
    assert QUEUED_DELETE in fix


def test_a_queued_node_with_both_deletes_is_armed_and_a_plain_nodes_check_is_unchanged(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    state.granted = ["tpu.nodes.delete", QUEUED_DELETE]
    queued = dataclasses.replace(_config("40e0ef", boot_grace_seconds=60.0), queued_resource=NODE)
    _boot(armed, Armed(queued, address))
    wait_until(lambda: state.states(), "the queued node's state")
    assert state.states() == ["armed"]
    with state.lock:
        state.requests.clear()
        state.attributes.clear()
    _boot(armed, Armed(_config("40e0f0", boot_grace_seconds=60.0), address))
    wait_until(lambda: state.states(), "the plain node's state")
    iam = [r for r in state.requests if r.path.endswith(":testIamPermissions")]
    # Byte for byte what a plain node's watchdog always sent.
    assert iam[0].body == '{"permissions": ["tpu.nodes.delete"]}'
    assert state.states() == ["armed"]


# -- a DELETE refused for good -------------------------------------------------------------


def test_a_delete_refused_for_good_is_published_and_retried_with_backoff_not_a_spin(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    """403 on every DELETE: the watchdog says so (error: delete refused, which the
    laptop reads as not armed) and keeps trying -- a grant may still come -- but each
    wait doubles (1, 2, 4, ... s, at most 30 s), so it never hammers the API."""
    state, address = cloud
    state.delete_statuses = [403] * 1000
    dog = _boot(armed, Armed(_config("403403", boot_grace_seconds=1.0), address))
    # Tries at 0, 1 and 3 s (then 7, 15 s): the third is waited for, then the gaps
    # between them are what shows a backoff rather than a spin (a spin would have sent
    # its third within a fraction of a second) or a fixed retry (gaps that do not grow).
    wait_until(lambda: len(state.deletes()) >= 3, "three DELETEs", timeout=60)
    tries = state.deletes()[:3]
    gaps = [b.at - a.at for a, b in itertools.pairwise(tries)]
    assert gaps == sorted(gaps), gaps  # the waits grow
    assert gaps[0] >= 1.0 - 0.2, gaps
    assert gaps[-1] >= 2.0 - 0.2, gaps
    refused = parse_state(state.states()[-1])
    assert state.states()[:2] == ["armed", "firing: lease expired"]
    assert refused.kind == "error"
    assert not refused.armed
    assert "delete refused (403" in refused.detail
    # Published once, not at every try.
    assert state.states().count(state.states()[-1]) == 1
    assert dog.alive(), "it keeps trying"


# -- the metadata server not up yet ---------------------------------------------------------


def test_a_metadata_server_not_up_at_boot_is_waited_for_then_it_arms(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    """503 for the first 2 s (the guest environment still starting): it retries every
    poll, publishes nothing alarming while its grace lasts, then arms and fires on time."""
    state, address = cloud
    state.identity_down_until = time.monotonic() + 2.0
    dog = _boot(armed, Armed(_config("5035a1", boot_grace_seconds=5.0), address))
    wait_until(lambda: state.states(), "a published state")
    armed_at = state.published("armed").at
    assert armed_at - dog.started >= 2.0 - 0.5
    assert state.states()[0] == "armed"
    assert "metadata server: 503" in dog.log()
    wait_until(lambda: state.deletes(), "the DELETE")
    # The grace ran from the watchdog's start (before its first request, after
    # dog.started), not from when the metadata server answered.
    fired = state.deletes()[0].at
    assert fired - dog.started >= 5.0, fired - dog.started
    assert fired - state.requests[0].at < 5.0 + LATE, fired - state.requests[0].at


def test_a_metadata_server_down_past_the_grace_is_published_and_nothing_deleted(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    state.identity_down_until = time.monotonic() + 600.0
    dog = _boot(armed, Armed(_config("5035a2", boot_grace_seconds=1.0), address))
    wait_until(lambda: state.states(), "a published state")
    parsed = parse_state(state.states()[0])
    assert parsed.kind == "error"
    assert "cannot learn this VM's identity" in parsed.detail
    # Two more rounds of asking who it is, past its grace, counted as they happen.
    asked = state.reads("instance/attributes/tpu-env")
    wait_until(
        lambda: state.reads("instance/attributes/tpu-env") >= asked + 2, "two more identity reads"
    )
    assert state.deletes() == [], "it cannot know what to delete"
    assert dog.alive(), "it keeps asking"
    # It recovers: identity known, and since the grace is long gone, it fires at once.
    state.identity_down_until = 0.0
    wait_until(lambda: state.deletes(), "the DELETE once the metadata server answers")
    assert state.states()[-1] == "firing: lease expired"


# -- the watchdog's own restart after a crash ------------------------------------------------


def test_a_crashing_watchdog_restarts_in_its_process_and_keeps_its_start(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    """A token the watchdog cannot read as an object (`[]`) raises TypeError out of
    its run: main() publishes the failure and starts over with the same clock. (Nothing
    restarts a killed watchdog process before the next boot: the startup-script execs it
    once.) Once the token is readable it arms and fires on its ORIGINAL grace."""
    state, address = cloud
    state.token_body = "[]"
    dog = _boot(armed, Armed(_config("c4a5e1", boot_grace_seconds=2.0), address))
    wait_until(
        lambda: any("the watchdog failed: TypeError" in s for s in state.states()), "the crash"
    )
    time.sleep(2.5)  # past the grace (counted from before dog.started), crashing and restarting
    assert state.deletes() == []
    assert dog.log().count("starting over") >= 2
    state.token_body = None
    wait_until(lambda: state.deletes(), "the DELETE after the restart")
    # Fired at its first poll after arming (the grace had run out), not a new grace
    # later: a restart that started its clock over would poll for two more seconds.
    with state.lock:
        seen = list(state.requests)
    armed_at = next(i for i, r in enumerate(seen) if r.method == "PUT" and r.body == "armed")
    deleted_at = next(i for i, r in enumerate(seen) if r.method == "DELETE")
    polls = [r for r in seen[armed_at:deleted_at] if r.path.endswith("/instance/preempted")]
    assert len(polls) <= 1, len(polls)
    assert state.states()[-2:] == ["armed", "firing: lease expired"]
    assert dog.alive()
