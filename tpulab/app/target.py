"""Which Cloud TPU API a command talks to: Google, an --api-endpoint, or --emulate.

`run`, `list`, `teardown` and the session commands share it so that they reach the same
nodes: the embedded emulator keeps its state in one directory, and every API is the real
client (`GoogleTpuApi`), built here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tpulab.cloud.api import TpuApi

__all__ = ["adc_project", "api_context", "tpu_api"]

Notify = Callable[[str], None]


def tpu_api(
    project: str,
    *,
    api_endpoint: str | None,
    notify: Notify | None = None,
    retry_for: float = 60.0,
    request_timeout: float = 60.0,
) -> TpuApi:
    """The API client for `project` at `api_endpoint` (None: Google's). `notify` hears
    that an endpoint has not answered yet and is being retried; `retry_for` bounds the
    retries of a call, `request_timeout` one request."""
    from tpulab.cloud.google import GoogleTpuApi

    return GoogleTpuApi(
        project,
        api_endpoint=api_endpoint,
        notify=notify,
        retry_for=retry_for,
        request_timeout=request_timeout,
    )


def api_context(
    project: str,
    *,
    emulate: bool,
    api_endpoint: str | None,
    ssh: Literal["embedded", "openssh"] | None = None,
    notify: Notify | None = None,
) -> AbstractContextManager[TpuApi]:
    """The API for `project`; with `emulate` an in-process emulator lives as long as the
    context, with SSH hosts behind READY nodes only when `ssh` names a backend (`run`)."""
    from contextlib import nullcontext

    if emulate:
        from tpulab.app.embedded import emulated_api

        # Its OpenSSH hosts publish the login user they need (tpulab-emulator/ssh-user).
        return emulated_api(project, ssh=ssh)
    return nullcontext(tpu_api(project, api_endpoint=api_endpoint, notify=notify))


def adc_project() -> str | None:
    """The project of the Application Default Credentials, if any."""
    # Imported here: google.auth is heavy and only a real (non-dry) run needs it.
    from tpulab.cloud.google import adc_project as from_credentials

    return from_credentials()
