"""The one seam under the Cloud TPU API's verbs: send a wire request, get its answer.

`TpuV2Api` (tpulab.cloud.tpu_v2) writes each verb -- create, wait, get, list, delete,
guest attributes, queued resources -- once, as `WireRequest`s (tpulab.cloud.rest) sent
through a `Transport`, and reads each answer as the REST JSON object the API returns
(camelCase fields, enums by name). Two transports exist:

- `GoogleTransport` (tpulab.cloud.google): google-cloud-tpu's client sends the request,
  to Google or to an emulator alike, with its retries, reach schedule and error words;
- the dry run's recording transport (tpulab.run.recording): records the request and
  answers as the API would, so a plan is the run's own wire, with no verb copied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from tpulab.cloud.polling import wait_for_operation
from tpulab.cloud.rest import WireRequest

__all__ = ["Answer", "Transport", "TransportApi", "guest_values", "items_of"]

Answer = dict[str, Any]  # one REST JSON object (a Node, an Operation, a list page...)


class Transport(Protocol):
    """Sends one request of the Cloud TPU API; raises the tpulab error of a failure."""

    @property
    def call_count(self) -> int:
        """HTTP requests sent so far (each try of a retried call counts)."""
        ...

    def send(self, wire: WireRequest, *, what: str, idempotent: bool) -> Answer:
        """Send `wire` ("get node n in z" is `what`, for error messages); an
        `idempotent` one may be resent on a transient failure."""
        ...


class TransportApi:
    """What both providers' verbs (TpuV2Api, ComputeTpuApi) stand on: one project's
    requests sent through a `Transport`, operations polled on the schedule `poll` makes,
    lists paged `list_page_size` at a time (0: the API chooses)."""

    def __init__(
        self,
        project: str,
        transport: Transport,
        *,
        poll: Callable[[], Iterable[float]],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        list_page_size: int = 0,
    ) -> None:
        self.project = project
        self.transport = transport
        self._poll = poll
        self._clock = clock
        self._sleep = sleep
        self._list_page_size = list_page_size

    @property
    def call_count(self) -> int:
        return self.transport.call_count

    def _send(self, wire: WireRequest, what: str, *, idempotent: bool) -> Answer:
        return self.transport.send(wire, what=what, idempotent=idempotent)

    def _paged(
        self, wire_for: Callable[[str], WireRequest], what: str, field: str
    ) -> Iterator[Answer]:
        """Every item (`field`) of a list, page after page (`wire_for(page_token)`): one
        request a page, each counted and retried on its own."""
        token = ""
        while True:
            page = self._send(wire_for(token), what, idempotent=True)
            yield from items_of(page, field)
            token = str(page.get("nextPageToken") or "")
            if not token:
                return

    def _wait(
        self, wire: WireRequest, operation_name: str, done: Callable[[Answer], bool], timeout: float
    ) -> Answer:
        """Read the operation (`wire`) until `done` says it is, within `timeout`."""
        return wait_for_operation(
            lambda: self._send(wire, f"read operation {operation_name}", idempotent=True),
            done,
            operation_name=operation_name,
            timeout=timeout,
            backoff=self._poll(),
            clock=self._clock,
            sleep=self._sleep,
        )


def items_of(answer: Answer, field: str) -> list[Answer]:
    """The objects of a list field (a page's items, an error's details), if any."""
    items = answer.get(field) or []
    return [item for item in items if isinstance(item, dict)]


def guest_values(query_value: Answer) -> dict[str, str]:
    """A guest attributes `queryValue` (both APIs answer the same shape) as
    "namespace/key" -> value."""
    return {
        f"{item.get('namespace', '')}/{item.get('key', '')}": str(item.get("value", ""))
        for item in items_of(query_value, "items")
    }
