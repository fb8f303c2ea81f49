"""Input: flags + environment + files -> validated specs (the one validation place).

`endpoint` is the one rule for which API a command talks to (and whether credentials
go there); `resolve` finds the project and zone; `project_file` reads a workspace's
[tool.tpulab] defaults; `groups` holds the flag groups `run`, `up` and `exec` share;
`spec` validates a run's inputs into a `RunSpec` and `workload` its `-- CMD` part into a
`WorkloadSpec`; `commands` has one function per command turning its raw flags into a
validated spec. Nothing in this package contacts the cloud.
"""

from tpulab.config.commands import (
    CostsInputs,
    LocalVerifyInputs,
    RunInputs,
    Scope,
    TeardownInputs,
    costs_inputs,
    list_scope,
    local_verify_inputs,
    run_inputs,
    teardown_inputs,
)
from tpulab.config.endpoint import Endpoint, Target, choose_target, classify_endpoint
from tpulab.config.groups import CapacityFlags, PythonFlags, TargetFlags, TimeoutFlags
from tpulab.config.project_file import ProjectDefaults, load_project_file
from tpulab.config.resolve import (
    AdcProject,
    Resolved,
    check_seconds,
    find_project,
    find_zone,
    gcloud_config_value,
    parse_duration,
    resolve_project,
    resolve_zone,
    resolve_zones,
)
from tpulab.config.spec import (
    EMULATED_IMAGE,
    EMULATED_PROJECT,
    EMULATED_ZONE,
    SSH_USER,
    Mode,
    RunSpec,
    Timeouts,
    build_run_spec,
    new_run_id,
)
from tpulab.config.workload import (
    DEFAULT_MAX_FETCH,
    DEFAULT_MAX_UPLOAD,
    WorkloadFlags,
    WorkloadSpec,
    parse_size,
)

__all__ = [
    "DEFAULT_MAX_FETCH",
    "DEFAULT_MAX_UPLOAD",
    "EMULATED_IMAGE",
    "EMULATED_PROJECT",
    "EMULATED_ZONE",
    "SSH_USER",
    "AdcProject",
    "CapacityFlags",
    "CostsInputs",
    "Endpoint",
    "LocalVerifyInputs",
    "Mode",
    "ProjectDefaults",
    "PythonFlags",
    "Resolved",
    "RunInputs",
    "RunSpec",
    "Scope",
    "Target",
    "TargetFlags",
    "TeardownInputs",
    "TimeoutFlags",
    "Timeouts",
    "WorkloadFlags",
    "WorkloadSpec",
    "build_run_spec",
    "check_seconds",
    "choose_target",
    "classify_endpoint",
    "costs_inputs",
    "find_project",
    "find_zone",
    "gcloud_config_value",
    "list_scope",
    "load_project_file",
    "local_verify_inputs",
    "new_run_id",
    "parse_duration",
    "parse_size",
    "resolve_project",
    "resolve_zone",
    "resolve_zones",
    "run_inputs",
    "teardown_inputs",
]
