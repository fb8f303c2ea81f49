"""Which Cloud TPU API a command talks to: Google, an --api-endpoint, or --emulate.

`run`, `list` and `teardown` share it so that the three reach the same nodes: the
embedded emulator keeps its state in one directory, and every API is the real client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tpulab.cloud.api import TpuApi

__all__ = ["adc_project", "api_context", "reach_notice"]


def reach_notice(line: str) -> None:
    """How a command shows that its endpoint has not answered yet and is being retried
    ("cannot reach ..., retrying (2 of 5)"): on stderr, so --json output stays clean."""
    from rich.markup import escape

    from tpulab.cli._console import print_stderr

    print_stderr(f"[yellow]  · {escape(line)}[/]")


def api_context(
    project: str,
    *,
    emulate: bool,
    api_endpoint: str | None,
    ssh: Literal["embedded", "openssh"] | None = None,
) -> AbstractContextManager[TpuApi]:
    """The API for `project`; with `emulate` an in-process emulator lives as long as the
    context, with SSH hosts behind READY nodes only when `ssh` names a backend (`run`)."""
    from contextlib import nullcontext

    if emulate:
        from tpulab.cli._embedded import emulated_api

        # Its OpenSSH hosts publish the login user they need (tpulab-emulator/ssh-user).
        return emulated_api(project, ssh=ssh)
    from tpulab.cloud.google import GoogleTpuApi

    return nullcontext(GoogleTpuApi(project, api_endpoint=api_endpoint, notify=reach_notice))


def adc_project() -> str | None:
    # Imported here: google.auth is heavy and only a real (non-dry) run needs it.
    from tpulab.cloud.google import adc_project as from_credentials

    return from_credentials()
