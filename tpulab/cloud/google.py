"""`GoogleTpuApi`: the `TpuApi` on google-cloud-tpu's REST client, for Google or an emulator.

This module and `tpulab.cloud.client_errors` are the only ones that import `google.*`
(import-linter keeps it so), and they do so lazily so that
`tpulab --help` stays fast. One code path serves Google and a local endpoint such as
the emulator: the same `TpuClient` with the REST transport, differing only in the
endpoint URL and the credentials (Application Default Credentials vs anonymous).
Errors from google.api_core, google.auth and requests are translated by
`tpulab.cloud.client_errors` (shared with Compute's transport) into the `tpulab.errors`
tree, keeping the API's words in `api_message`. What each call sends is built by
`tpulab.cloud.rest` (the same builders `--dry-run` prints); this module only parses
those messages into the client's request types.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from tpulab.cloud import rest
from tpulab.cloud.client_errors import ClientSender, translate_client_error
from tpulab.cloud.polling import operation_schedule
from tpulab.cloud.reach import ReachSchedule
from tpulab.cloud.tpu_v2 import TpuV2Api
from tpulab.cloud.transport import Answer
from tpulab.config.endpoint import classify_endpoint
from tpulab.errors import (
    ConfigError,
)

__all__ = [
    "CallerSession",
    "GoogleTpuApi",
    "GoogleTransport",
    "adc_project",
    "caller_session",
]


def adc_project() -> str | None:
    """The project of Application Default Credentials, or None when there are none.

    The last step of project resolution (docs/architecture.md §1). Missing credentials are not an
    error here: the caller reports "no project" with every place it looked.
    """
    import google.auth
    from google.auth import exceptions as auth_exceptions

    try:
        _, project = google.auth.default()
    except auth_exceptions.DefaultCredentialsError:
        return None
    return str(project) if project else None


def _parse(message_type: Any, wire: rest.WireRequest) -> Any:
    """The client's request proto of `wire.message`; unknown fields are an error, so a
    builder cannot say something the client would silently drop."""
    return message_type.from_json(json.dumps(wire.message), ignore_unknown_fields=False)


class GoogleTransport(ClientSender):
    """The `Transport` of google-cloud-tpu's `TpuClient` (REST), to Google or an emulator.

    `api_endpoint` is None for Google, or a URL such as `http://127.0.0.1:8470` for a
    local endpoint (the REST transport keeps an explicit `http://` scheme). Application
    Default Credentials are attached only where `classify_endpoint` says so (Google over
    https); every other endpoint is called anonymously unless `credentials` are passed.
    Idempotent calls (get, list, guest attributes, operation get) ride out
    TransientErrors (503s, rate-limit 429s, lost replies) with backoff for up to
    `retry_for` seconds -- less when an enclosing wait's deadline comes sooner, so the
    phase's deadline is what ends them (see `tpulab.polling`). Once the endpoint has
    answered, an UnreachableError is not retried here: the waits that must outlast a
    network blip retry it under their own deadline. Before it has answered anything,
    every call that may safely be resent (any idempotent one; a create or delete only
    while it was never sent) is retried on the short `reach` schedule, `notify` hearing
    each retry, and then fails as an EndpointDownError that ends every wait
    (`tpulab.cloud.reach`). Create and delete are otherwise sent once: whether resending
    is safe is the caller's call (the run engine checks the node does not exist first).
    """

    def __init__(
        self,
        *,
        api_endpoint: str | None = None,
        credentials: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        retry_for: float = 60.0,
        retry_backoff: Callable[[], Iterable[float]] | None = None,
        request_timeout: float = 60.0,
        reach: ReachSchedule | None = None,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        from google.api_core.client_options import ClientOptions
        from google.cloud import tpu_v2

        endpoint = classify_endpoint(api_endpoint)  # the one rule; ConfigError if malformed
        super().__init__(
            api_endpoint,
            "tpu.googleapis.com",
            api="the Cloud TPU API",
            retry_for=retry_for,
            request_timeout=request_timeout,
            clock=clock,
            sleep=sleep,
            notify=notify,
            retry_backoff=retry_backoff,
            reach=reach,
        )
        self.api_endpoint = api_endpoint
        if credentials is None:
            credentials = (
                self._default_credentials() if endpoint.sends_credentials else self._anonymous()
            )
        options = ClientOptions(api_endpoint=api_endpoint) if api_endpoint else None
        self._client = tpu_v2.TpuClient(
            credentials=credentials, transport="rest", client_options=options
        )

    @staticmethod
    def _anonymous() -> Any:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()  # type: ignore[no-untyped-call]

    @staticmethod
    def _default_credentials() -> Any:
        import google.auth
        from google.auth import exceptions as auth_exceptions

        try:
            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
        except auth_exceptions.DefaultCredentialsError as error:
            raise ConfigError(
                f"No Google Cloud credentials found: {error}",
                hint="Run `gcloud auth application-default login`, or rehearse offline "
                "with --emulate.",
            ) from None
        return credentials

    @property
    def unreachable(self) -> str | None:
        """Why the endpoint was declared down (it never answered this instance), or None."""
        return self._reach.down

    # -- the transport ---------------------------------------------------------------

    def send(self, wire: rest.WireRequest, *, what: str, idempotent: bool) -> Answer:
        """`wire` through the client (its request proto parsed from the wire message, so a
        builder cannot say something the client would drop); the answer as REST JSON."""
        if wire.rpc == "GetOperation":
            # The operations mixin takes its request as a plain dict of the message.
            return _operation_json(
                self._send_through(
                    lambda timeout: self._client.get_operation(
                        request=wire.message, retry=None, timeout=timeout
                    ),
                    what,
                    idempotent=idempotent,
                )
            )
        from google.cloud import tpu_v2

        request = _parse(getattr(tpu_v2, f"{wire.rpc}Request"), wire)
        method = getattr(self._client, _snake(wire.rpc))
        answer = self._send_through(
            lambda timeout: method(request=request, retry=None, timeout=timeout),
            what,
            idempotent=idempotent,
        )
        if hasattr(answer, "operation"):  # a long-running call: its Operation
            return _operation_json(answer.operation)
        if wire.rpc.startswith("List"):
            # One page (the pager's first response), never the pager's own iteration,
            # so that every HTTP request is counted and retried individually.
            field = "nodes" if wire.rpc == "ListNodes" else "queued_resources"
            return {
                _camel(field): [_message_json(item) for item in getattr(answer, field)],
                "nextPageToken": str(answer.next_page_token),
            }
        return _message_json(answer)

    # -- plumbing --------------------------------------------------------------------


class GoogleTpuApi(TpuV2Api):
    """`TpuApi` over google-cloud-tpu's client (`GoogleTransport`), for Google or an
    emulator: the TPU v2 verbs (tpulab.cloud.tpu_v2) on the client's wire. `poll` makes
    the operation-polling schedule (default: about 1 s growing with jitter to 10 s;
    faster for a local endpoint); the other options are the transport's."""

    def __init__(
        self,
        project: str,
        *,
        api_endpoint: str | None = None,
        credentials: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll: Callable[[], Iterable[float]] | None = None,
        retry_for: float = 60.0,
        retry_backoff: Callable[[], Iterable[float]] | None = None,
        request_timeout: float = 60.0,
        list_page_size: int = 0,
        reach: ReachSchedule | None = None,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        if not project:
            raise ConfigError(
                "No Google Cloud project given.",
                hint="Pass --project, or set TPULAB_PROJECT or CLOUDSDK_CORE_PROJECT.",
            )
        self.google = GoogleTransport(
            api_endpoint=api_endpoint,
            credentials=credentials,
            sleep=sleep,
            clock=clock,
            retry_for=retry_for,
            retry_backoff=retry_backoff,
            request_timeout=request_timeout,
            reach=reach,
            notify=notify,
        )
        local = classify_endpoint(api_endpoint).is_loopback
        super().__init__(
            project,
            self.google,
            poll=poll if poll is not None else (lambda: operation_schedule(local=local)),
            clock=clock,
            sleep=sleep,
            list_page_size=list_page_size,
        )
        self.api_endpoint = api_endpoint

    @property
    def unreachable(self) -> str | None:
        """Why the endpoint was declared down (it never answered), or None."""
        return self.google.unreachable


def _snake(rpc: str) -> str:
    """ "GetGuestAttributes" -> "get_guest_attributes": the client's method of an rpc."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in rpc).lstrip("_")


def _camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(word.title() for word in rest)


def _message_json(message: Any) -> Answer:
    """A proto-plus message as the API's REST JSON (camelCase, enums by name)."""
    return dict(
        type(message).to_dict(
            message, use_integers_for_enums=False, preserving_proto_field_name=False
        )
    )


def _operation_json(operation: Any) -> Answer:
    """A google.longrunning Operation as REST JSON: name, done, error and the metadata's
    verb and target (unpacked from its Any)."""
    from google.cloud.tpu_v2.types import OperationMetadata

    answer: Answer = {"name": str(operation.name), "done": bool(operation.done)}
    if operation.HasField("error") and operation.error.code != 0:
        answer["error"] = {
            "code": int(operation.error.code),
            "message": str(operation.error.message),
        }
    metadata = OperationMetadata.pb()()
    if operation.metadata.Unpack(metadata):
        answer["metadata"] = {"verb": metadata.verb, "target": metadata.target}
    return answer


# -- the project's other APIs (Service Usage, Resource Manager, Compute) ---------------


class CallerSession:
    """An HTTP session for Google's project-level REST APIs (`tpulab.cloud.preflight`),
    with the same credentials rule as `GoogleTpuApi`: Application Default Credentials
    to Google over https, nothing to any other endpoint. `account` is whom the
    credentials belong to ("" when Google would not say); `credentials` says which."""

    def __init__(self, session: Any, *, account: str, credentials: str) -> None:
        self.session = session
        self.account = account
        self.credentials = credentials


def caller_session(
    api_endpoint: str | None, *, timeout: float = 30.0, with_account: bool = True
) -> CallerSession:
    """The session `tpulab doctor` asks with. For Google: ADC, refreshed once here so a
    missing or expired login is said now (ConfigError / PermissionDeniedError), with
    the account the token belongs to (its service account, else Google's tokeninfo;
    `with_account=False`: not asked, "", as a run's preflight needs no name)."""
    import requests

    endpoint = classify_endpoint(api_endpoint)
    if not endpoint.sends_credentials:
        # An emulator answers tokeninfo for its anonymous caller (the project owner).
        session = requests.Session()
        account = (
            _tokeninfo_email(session, f"{api_endpoint}/tokeninfo", {}, timeout)
            if with_account
            else ""
        )
        return CallerSession(
            session, account=account, credentials=f"no credentials (sent none: {api_endpoint})"
        )
    from google.auth.transport.requests import AuthorizedSession, Request

    credentials = GoogleTransport._default_credentials()
    try:
        credentials.refresh(Request())
    except Exception as error:  # RefreshError, TransportError: translated below
        raise translate_client_error(
            error, "refresh the credentials", "oauth2.googleapis.com"
        ) from None
    account = str(getattr(credentials, "service_account_email", "") or "")
    kind = "a service account" if account else "a user login"
    if not account and with_account:
        account = _tokeninfo_email(
            requests.Session(),
            "https://oauth2.googleapis.com/tokeninfo",
            {"access_token": str(credentials.token)},
            timeout,
        )
    return CallerSession(
        AuthorizedSession(credentials),  # type: ignore[no-untyped-call]
        account=account,
        credentials=f"Application Default Credentials ({kind})",
    )


def _tokeninfo_email(session: Any, url: str, params: dict[str, str], timeout: float) -> str:
    """The `email` OAuth2 tokeninfo says the token belongs to; "" when it will not say
    (the account is a nicety: the credentials themselves were proven by the refresh)."""
    import requests

    try:
        answer = session.get(url, params=params, timeout=timeout)
        body = answer.json() if answer.ok else {}
    except (requests.RequestException, ValueError):
        return ""
    return str(body.get("email") or "") if isinstance(body, dict) else ""
