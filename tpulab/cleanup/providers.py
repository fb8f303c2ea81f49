"""The two providers as cleanup sees them: which API holds a node, and how to price it.

A TPU VM lives behind the Cloud TPU API (a node) or Compute Engine (an instance,
tpulab.cloud.compute_v1); each API answers NOT_FOUND for the other's resources. So every
step that lists, checks or deletes a journalled node goes to the API of the row's
provider, and `list`/`teardown --verify` ask both: another machine's instance is found
only by Compute's label filter.
"""

from __future__ import annotations

from collections.abc import Mapping

from tpulab import catalog
from tpulab.cloud.api import TpuApi
from tpulab.errors import CloudError, PermissionDeniedError

__all__ = [
    "COMPUTE",
    "TPU_API",
    "Apis",
    "accelerator_of",
    "apis_of",
    "cannot_be_asked",
    "provider_name",
    "where",
]

TPU_API = "tpu-api"
COMPUTE = "compute"

# Provider name -> its API for one project and target (the Cloud TPU API first).
Apis = Mapping[str, TpuApi]

_NAMES = {TPU_API: "the Cloud TPU API", COMPUTE: "Compute Engine"}


def apis_of(api: TpuApi | Apis) -> dict[str, TpuApi]:
    """A bare TpuApi is the Cloud TPU API alone (callers that predate providers)."""
    if isinstance(api, Mapping):
        return dict(api)
    return {TPU_API: api}


def provider_name(provider: str) -> str:
    return _NAMES.get(provider, provider)


def where(zone: str, provider: str) -> str:
    """A zone as a list error names it: the Cloud TPU API's zones by name alone (as
    before there were providers), Compute's marked, so each says which listing failed."""
    return zone if provider == TPU_API else f"{zone} ({provider})"


def cannot_be_asked(provider: str, error: CloudError) -> bool:
    """Compute refused to answer at all (API disabled, permission denied): the project
    never used it for tpulab, or this caller cannot see it. A note, not a failure, where
    no journal row needs it. Any other error (or the Cloud TPU API's) stays a failure."""
    return provider == COMPUTE and isinstance(error, PermissionDeniedError)


def accelerator_of(accelerator_type: str) -> catalog.Accelerator | None:
    """The catalog row of a node's type: an accelerator name (a Cloud TPU API node, a
    journal row) or a Compute machine type (an instance); None when unknown."""
    found = catalog.CATALOG.get(accelerator_type)
    if found is not None:
        return found
    for accelerator in catalog.CATALOG.values():
        if accelerator_type and accelerator.machine_type == accelerator_type:
            return accelerator
    return None
