"""Input: flags + environment + files -> a validated `RunSpec` (the one validation place).

`resolve` finds the project and zone; `spec` validates a run's inputs into a `RunSpec`.
Nothing in this package contacts the cloud.
"""

from tpulab.config.resolve import (
    AdcProject,
    Resolved,
    gcloud_config_value,
    resolve_project,
    resolve_zone,
    resolve_zones,
)
from tpulab.config.spec import (
    EMULATED_PROJECT,
    EMULATED_ZONE,
    SSH_USER,
    Mode,
    RunSpec,
    Timeouts,
    build_run_spec,
    is_loopback_endpoint,
    new_run_id,
)

__all__ = [
    "EMULATED_PROJECT",
    "EMULATED_ZONE",
    "SSH_USER",
    "AdcProject",
    "Mode",
    "Resolved",
    "RunSpec",
    "Timeouts",
    "build_run_spec",
    "gcloud_config_value",
    "is_loopback_endpoint",
    "new_run_id",
    "resolve_project",
    "resolve_zone",
    "resolve_zones",
]
