"""Which Cloud TPU API a command talks to: Google, an --api-endpoint, or --emulate; and
through which provider: the Cloud TPU API's nodes or Compute Engine's instances
(tpulab.cloud.compute_v1, docs/reference/providers.md).

`run`, `list`, `teardown` and the session commands share it so that they reach the same
nodes: the embedded emulator keeps its state in one directory, and every API is the real
client (`GoogleTpuApi`), built here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tpulab.cloud.api import TpuApi

__all__ = [
    "adc_project",
    "api_context",
    "compute_api",
    "provider_api",
    "provider_apis",
    "tpu_api",
]

Notify = Callable[[str], None]


def tpu_api(
    project: str,
    *,
    api_endpoint: str | None,
    notify: Notify | None = None,
    retry_for: float = 60.0,
    request_timeout: float = 60.0,
    provider: str = "tpu-api",
    image: str | None = None,
    image_needed: bool = True,
) -> TpuApi:
    """The API client for `project` at `api_endpoint` (None: Google's). `notify` hears
    that an endpoint has not answered yet and is being retried; `retry_for` bounds the
    retries of a call, `request_timeout` one request. `provider` "compute" builds the
    Compute Engine provider instead (`image`: its boot image; `image_needed` False for a
    client that only finds, reads and deletes what exists)."""
    from tpulab.cloud.google import GoogleTpuApi

    if provider == "compute":
        return compute_api(
            project,
            api_endpoint=api_endpoint,
            image=image,
            notify=notify,
            retry_for=retry_for,
            request_timeout=request_timeout,
            image_needed=image_needed,
        )

    return GoogleTpuApi(
        project,
        api_endpoint=api_endpoint,
        notify=notify,
        retry_for=retry_for,
        request_timeout=request_timeout,
    )


def provider_api(
    project: str,
    *,
    provider: str,
    api_endpoint: str | None,
    notify: Notify | None = None,
    retry_for: float = 60.0,
    request_timeout: float = 60.0,
) -> TpuApi:
    """`provider`'s API for what exists already (get, list, delete, guest attributes):
    what a session's later commands (`exec`, `ssh`, `down`, ...) reach its node through,
    by the provider its state names. Compute's is built without an image: only a create
    sends one, and none is asked of a session."""
    return tpu_api(
        project,
        api_endpoint=api_endpoint,
        notify=notify,
        retry_for=retry_for,
        request_timeout=request_timeout,
        provider=provider,
        image_needed=False,
    )


def compute_api(
    project: str,
    *,
    api_endpoint: str | None,
    image: str | None,
    notify: Notify | None = None,
    retry_for: float = 60.0,
    request_timeout: float = 60.0,
    image_needed: bool = True,
) -> TpuApi:
    """The Compute Engine provider: instances at Compute's root (ProjectApis finds it,
    at Google or `<endpoint>/compute/v1/`), over the caller's authorised session.
    `image_needed=False` builds it for list, get and delete (cleanup), which send no
    image: one that tried to create would send an empty sourceImage, which Compute
    refuses."""
    from tpulab import catalog
    from tpulab.cloud.compute_v1 import (
        EMULATOR_NAMESPACE,
        HOST_KEYS_QUERY,
        ComputeTpuApi,
        ComputeTransport,
    )
    from tpulab.cloud.google import caller_session
    from tpulab.cloud.polling import operation_schedule
    from tpulab.cloud.project_apis import ProjectApis
    from tpulab.config.endpoint import classify_endpoint
    from tpulab.errors import ConfigError

    if image_needed and not image:
        # The TPU VM image of a Compute instance could not be confirmed from Google's
        # pages (docs/reference/providers.md): tpulab does not guess one.
        raise ConfigError(
            "The Compute provider needs the boot image of the TPU VM instance; none was given.",
            hint="Pass --image (or [tool.tpulab] image) with the TPU VM image Google's "
            "'Create a TPU VM instance' page names for your machine type.",
        )

    def machine_type_of(accelerator_type: str) -> str:
        accelerator = catalog.lookup(accelerator_type)
        catalog.check_provider(accelerator, "compute")
        return str(accelerator.machine_type)

    session = caller_session(api_endpoint, timeout=request_timeout, with_account=False)
    apis = ProjectApis(session.session, api_endpoint, timeout=request_timeout)
    local = classify_endpoint(api_endpoint).is_loopback
    return ComputeTpuApi(
        project,
        ComputeTransport(
            apis,
            session.session,
            api_endpoint=api_endpoint,
            retry_for=retry_for,
            request_timeout=request_timeout,
            notify=notify,
        ),
        machine_type_of=machine_type_of,
        image=image or "",
        poll=lambda: operation_schedule(local=local),
        # A local endpoint is an emulator: its SSH port and user are published too.
        published=(HOST_KEYS_QUERY, EMULATOR_NAMESPACE) if local else (HOST_KEYS_QUERY,),
    )


def api_context(
    project: str,
    *,
    emulate: bool,
    api_endpoint: str | None,
    ssh: Literal["embedded", "openssh"] | None = None,
    notify: Notify | None = None,
    provider: str = "tpu-api",
    image: str | None = None,
) -> AbstractContextManager[TpuApi]:
    """The API for `project`; with `emulate` an in-process emulator lives as long as the
    context, with SSH hosts behind READY nodes only when `ssh` names a backend (`run`)."""
    from contextlib import nullcontext

    if emulate:
        from tpulab.app.embedded import emulated_api

        # Its OpenSSH hosts publish the login user they need (tpulab-emulator/ssh-user).
        # The emulator serves Compute's instances too; it boots any image alike, so
        # --image may be left out (tpulab.app.embedded.EMULATED_IMAGE).
        return emulated_api(project, ssh=ssh, provider=provider, image=image)
    return nullcontext(
        tpu_api(project, api_endpoint=api_endpoint, notify=notify, provider=provider, image=image)
    )


@contextmanager
def provider_apis(
    project: str,
    *,
    emulate: bool,
    api_endpoint: str | None,
    notify: Notify | None = None,
) -> Iterator[dict[str, TpuApi]]:
    """Every provider's API for `project` at one target, by provider name ("tpu-api",
    "compute"), for the commands that find what tpulab left behind (`list`, `teardown
    --verify`, `tpulab.sweep`): each API is blind to the other's resources (the embedded
    emulator serves both, as Google does). Building the Compute provider sends nothing:
    whether Compute answers is learnt by asking it (tpulab.cleanup.providers)."""
    from contextlib import suppress

    from tpulab.errors import TpuLabError

    def with_compute(api: TpuApi, endpoint: str | None) -> dict[str, TpuApi]:
        apis = {"tpu-api": api}
        # Left out if it cannot be built: a journal row of a Compute run then reads as
        # "cannot be asked" (never as gone), and the listing of nodes goes on.
        with suppress(TpuLabError):
            apis["compute"] = tpu_api(
                project,
                api_endpoint=endpoint,
                notify=notify,
                provider="compute",
                image_needed=False,
            )
        return apis

    if emulate:
        from tpulab.app.embedded import emulated_target

        # The embedded emulator serves Compute's instances too, at its own URL.
        with emulated_target(project) as target:
            yield with_compute(target.api, target.emulator.url)
        return
    with api_context(project, emulate=False, api_endpoint=api_endpoint, notify=notify) as api:
        yield with_compute(api, api_endpoint)


def adc_project() -> str | None:
    """The project of the Application Default Credentials, if any."""
    # Imported here: google.auth is heavy and only a real (non-dry) run needs it.
    from tpulab.cloud.google import adc_project as from_credentials

    return from_credentials()
