"""OS Login: with `enable-oslogin=TRUE` in project metadata the guest agent ignores the
node's ssh-keys, so tpulab turns it off in the node's own metadata (which overrides the
project's unless an organisation policy enforces it), and says so when auth is refused.

The emulator's `project_os_login` fault plays the project setting: its SSH hosts then
accept no key unless the node's metadata says `enable-oslogin: FALSE`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from delegating_api import DelegatingTpuApi

from tpulab.contract import OS_LOGIN_METADATA
from tpulab.errors import AuthError
from tpulab.models import NodeRequest

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


class CreatesWithoutOsLoginOverride(DelegatingTpuApi):
    """Sends CreateNode as a tool that knows nothing of OS Login would."""

    def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
        metadata = {k: v for k, v in request.metadata.items() if k != OS_LOGIN_METADATA}
        return self.api.create_node(
            zone, node_id, request.model_copy(update={"metadata": metadata})
        )


def test_a_run_logs_in_although_the_project_turns_os_login_on(rig: Rig) -> None:
    rig.emulator.faults.project_os_login = True
    seen: list[dict[str, str]] = []

    class Watch(DelegatingTpuApi):
        def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
            seen.append(dict(request.metadata))
            return self.api.create_node(zone, node_id, request)

    life, _, error = rig.run(rig.spec(), api=Watch(rig.api))
    assert error is None, error
    assert life.outcome.verdict == "verified"
    assert seen[0][OS_LOGIN_METADATA] == "FALSE"
    assert rig.leftovers() == []


def test_without_the_override_auth_fails_and_the_error_names_os_login(embedded_rig: Rig) -> None:
    embedded_rig.emulator.faults.project_os_login = True
    life, _, error = embedded_rig.run(
        embedded_rig.spec(), api=CreatesWithoutOsLoginOverride(embedded_rig.api)
    )
    assert isinstance(error, AuthError), error
    assert "OS Login" in (error.hint or "")
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []
