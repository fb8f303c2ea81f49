"""The CLI's binding of the target (tpulab.app.target): an endpoint that has not answered
yet is shown on stderr while it is retried, so --json output stays clean."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from tpulab.app.target import adc_project

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tpulab.cloud.api import TpuApi

__all__ = ["adc_project", "api_context", "reach_notice", "tpu_api"]


def reach_notice(line: str) -> None:
    """How a command shows that its endpoint has not answered yet and is being retried
    ("cannot reach ..., retrying (2 of 5)")."""
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
    from tpulab.app import target

    return target.api_context(
        project, emulate=emulate, api_endpoint=api_endpoint, ssh=ssh, notify=reach_notice
    )


def tpu_api(
    project: str,
    *,
    api_endpoint: str | None,
    retry_for: float = 60.0,
    request_timeout: float = 60.0,
    provider: str = "tpu-api",
    image: str | None = None,
) -> TpuApi:
    from tpulab.app import target

    return target.tpu_api(
        project,
        api_endpoint=api_endpoint,
        notify=reach_notice,
        retry_for=retry_for,
        request_timeout=request_timeout,
        provider=provider,
        image=image,
    )
