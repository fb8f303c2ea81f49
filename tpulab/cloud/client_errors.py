"""The client stack's exceptions in tpulab's words: one translation for both providers.

google.api_core's HTTP errors, google.auth's refresh and transport failures and requests'
network errors become the `tpulab.errors` tree (through `tpulab.cloud.classify`), keeping
the API's own words in `api_message`. The TPU API's transport (`tpulab.cloud.google`) and
Compute Engine's (`tpulab.cloud.compute_v1`) both send through `ClientSender`, which hands
their raw exceptions here, so a refused connection or an expired token reads the same
whichever API was asked. google.*,
requests and urllib3 are imported inside the functions: `tpulab --help` never pays for them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from tpulab.cloud.classify import HTTP_STATUS, error_for_status, hint_for
from tpulab.cloud.reach import ReachSchedule, reach_of, send_through
from tpulab.cloud.reach import retry_backoff as retry_backoff_of
from tpulab.errors import (
    OutcomeUnknownError,
    PermissionDeniedError,
    TransientError,
    UnreachableError,
)

__all__ = ["ClientSender", "network_words", "translate_client_error", "worth_retrying"]

T = TypeVar("T")


class ClientSender:
    """What both providers' transports (GoogleTransport, ComputeTransport) keep: their
    endpoint's `Reach`, the count of requests sent, and one way to send: through
    `tpulab.cloud.reach.send_through`, what the client stack raised translated here.
    `retry_backoff` makes the pauses of idempotent retries (None: the endpoint's own)."""

    def __init__(
        self,
        api_endpoint: str | None,
        google_host: str,
        *,
        api: str,
        retry_for: float,
        request_timeout: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        notify: Callable[[str], None] | None,
        retry_backoff: Callable[[], Iterable[float]] | None = None,
        reach: ReachSchedule | None = None,
    ) -> None:
        self._retry_for = retry_for
        self._request_timeout = request_timeout
        self._clock = clock
        self._sleep = sleep
        self._retry_backoff = retry_backoff or (lambda: retry_backoff_of(api_endpoint))
        self._calls = 0
        self._calls_lock = threading.Lock()  # `tpulab list` lists zones concurrently
        self._endpoint_text = api_endpoint or google_host
        self._reach = reach_of(
            api_endpoint, google_host, api=api, clock=clock, notify=notify, schedule=reach
        )

    @property
    def call_count(self) -> int:
        return self._calls

    def _send_through(self, send: Callable[[float], T], what: str, *, idempotent: bool) -> T:
        """One request, `send(timeout)`, with reach_of's and send_through's retries."""

        def counted() -> None:
            with self._calls_lock:
                self._calls += 1

        return send_through(
            self._reach,
            send,
            what=what,
            idempotent=idempotent,
            translate=lambda raw: translate_client_error(raw, what, self._endpoint_text),
            network_words=network_words,
            worth_retrying=worth_retrying,
            request_timeout=self._request_timeout,
            retry_for=self._retry_for,
            backoff=self._retry_backoff(),
            clock=self._clock,
            sleep=self._sleep,
            counted=counted,
        )


def translate_client_error(error: Exception, what: str, endpoint: str) -> Exception:
    """Map an exception raised by the client stack to a tpulab error (or leave it be)."""
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions
    from requests import exceptions as http_exceptions

    if isinstance(error, api_exceptions.GoogleAPICallError):
        status, api_message = _status_and_message(error)
        return error_for_status(status, api_message, what, reason=error.reason or "")
    if isinstance(error, auth_exceptions.RefreshError):
        return PermissionDeniedError(
            f"Could not {what}: the credentials could not be refreshed.",
            status="UNAUTHENTICATED",
            api_message=str(error),
            hint="Run `gcloud auth application-default login` and try again.",
        )
    if isinstance(error, auth_exceptions.TransportError):
        # The token is fetched before the API request goes out: it was never sent.
        return UnreachableError(
            f"Could not {what}: cannot reach Google's sign-in service to refresh "
            "credentials; the request was never sent.",
            status="UNAVAILABLE",
            api_message=str(error),
            hint="Check the network and retry; offline, rehearse with --emulate.",
        )
    if isinstance(error, http_exceptions.ConnectionError | http_exceptions.Timeout):
        return _network_error(error, what, endpoint)
    return error


def _network_error(error: OSError, what: str, endpoint: str) -> TransientError:
    """No HTTP answer: tell "never sent" (nothing can have happened) from "sent, no
    answer" (the server may have acted), because after a CreateNode the first means
    nothing exists and the second means a node may."""
    from requests import exceptions as http_exceptions
    from urllib3 import exceptions as url_exceptions

    cause = error.args[0] if error.args else None
    if isinstance(cause, url_exceptions.MaxRetryError):
        cause = cause.reason
    # urllib3 raises NewConnectionError (refused) and NameResolutionError (DNS), both
    # ConnectTimeoutError subclasses, before a byte of the request is written.
    if isinstance(error, http_exceptions.ConnectTimeout) or isinstance(
        cause, url_exceptions.ConnectTimeoutError
    ):
        return UnreachableError(
            f"Could not {what}: cannot reach {endpoint} ({_reason(cause or error)}); "
            "the request was never sent.",
            status="UNAVAILABLE",
            api_message=str(error),
            hint="Check the network, the --api-endpoint URL (or that the emulator is "
            "running, for a local one) and retry.",
        )
    if isinstance(error, http_exceptions.Timeout):
        return OutcomeUnknownError(
            f"Could not {what}: {endpoint} did not answer in time; the request was sent, "
            "so it may have taken effect.",
            status="DEADLINE_EXCEEDED",
            api_message=str(error),
            hint=hint_for(TransientError),
        )
    return OutcomeUnknownError(
        f"Could not {what}: the connection to {endpoint} broke after the request was "
        f"sent ({_reason(cause or error)}), so it may have taken effect.",
        status="UNAVAILABLE",
        api_message=str(error),
        hint="Check the network and retry; `tpulab list` shows what exists.",
    )


def network_words(error: BaseException) -> str:
    """What went wrong on the network, in a user's words, from the client's exception."""
    from google.auth import exceptions as auth_exceptions
    from requests import exceptions as http_exceptions
    from urllib3 import exceptions as url_exceptions

    if isinstance(error, auth_exceptions.TransportError):
        return "cannot reach Google's sign-in service"
    cause = error.args[0] if error.args else None
    if isinstance(cause, url_exceptions.MaxRetryError):
        cause = cause.reason
    if isinstance(cause, url_exceptions.NameResolutionError):
        return "its host name could not be resolved"
    if isinstance(cause, url_exceptions.NewConnectionError):
        return _reason(cause)  # the OS's words: "Connection refused"
    if isinstance(error, http_exceptions.ConnectTimeout) or isinstance(
        cause, url_exceptions.ConnectTimeoutError
    ):
        return "the connection timed out"
    if isinstance(error, http_exceptions.Timeout):
        return "it accepted the connection but never answered"
    return f"the connection broke before an answer: {_reason(cause or error)}"


def _reason(error: BaseException) -> str:
    """The OS's own words ("Connection refused") when it said any, not urllib3's wrapping."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return str(seen.strerror)
        seen = seen.__cause__ or seen.__context__
    return str(error)[:160]


def worth_retrying(error: Exception) -> bool:
    return isinstance(error, TransientError) and not isinstance(error, UnreachableError)


def _status_and_message(error: Any) -> tuple[str, str]:
    """The google.rpc status name and the API's own message from an HTTP error."""
    payload: dict[str, Any] = {}
    response = getattr(error, "response", None)
    if response is not None:
        try:
            body = response.json()
            if isinstance(body, dict) and isinstance(body.get("error"), dict):
                payload = body["error"]
        except ValueError:
            payload = {}
    code = int(error.code) if isinstance(error.code, int) else 0
    status = str(payload.get("status") or HTTP_STATUS.get(code) or "UNKNOWN")
    message = str(payload.get("message") or error.message)
    return status, message
