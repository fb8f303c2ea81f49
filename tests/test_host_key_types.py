"""A VM that publishes no ed25519 host key is still pinned: with whatever type the
guest agent publishes (ecdsa, then rsa), never trusted on first use.

The emulator's `host_key_types` fault publishes only the given types; both SSH backends
serve all three, so the client must negotiate exactly the pinned one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tpulab.contract import HOST_KEY_NAMESPACE
from tpulab.remote.keys import host_key_from

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

ED25519 = "AAAAC3NzaC1lZDI1NTE5AAAAIGq0jvXw8Pp2pKzF5yWl3NsqU3d8gVqzJ3P1o9r8bXcY"


def test_ed25519_is_preferred_when_several_types_are_published() -> None:
    rsa = "AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"
    attrs = {f"{HOST_KEY_NAMESPACE}/ssh-rsa": rsa, f"{HOST_KEY_NAMESPACE}/ssh-ed25519": ED25519}
    assert host_key_from(attrs).key_type == "ssh-ed25519"


@pytest.mark.parametrize("published", ["ecdsa-sha2-nistp256", "ssh-rsa"])
def test_a_node_without_ed25519_is_pinned_by_the_type_it_publishes(
    rig: Rig, published: str
) -> None:
    rig.emulator.faults.host_key_types = [published]
    life, recorder, error = rig.run(rig.spec())
    assert error is None, error
    assert life.outcome.succeeded
    assert life.target is not None
    assert life.target.host_key.key_type == published
    pinned = [r.detail for r in recorder.phases if r.phase.value == "host-key"]
    assert pinned == [f"{published} pinned for {life.target.host}:{life.target.port}"]
    assert rig.leftovers() == []
