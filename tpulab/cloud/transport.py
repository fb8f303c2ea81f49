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

from typing import Any, Protocol

from tpulab.cloud.rest import WireRequest

__all__ = ["Answer", "Transport"]

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
