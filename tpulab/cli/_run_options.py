"""The flags `tpulab run` and `tpulab up` share (where the VM is, its Python, the
timeouts, the output), declared once so that their names and help cannot drift apart;
`_workload_options.py` does the same for the workload flags of `run` and `exec`."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = [
    "ApiEndpoint",
    "BootTimeout",
    "BootstrapTimeout",
    "Image",
    "Installer",
    "JaxVersion",
    "Network",
    "PayloadTimeout",
    "Project",
    "Provider",
    "Python",
    "ServiceAccount",
    "Subnetwork",
    "TeardownTimeout",
    "Verbose",
    "Zones",
]

Zones = Annotated[
    list[str] | None,
    typer.Option(
        "--zone",
        metavar="ZONE",
        help="Zone, e.g. us-central1-a (else TPULAB_ZONE, [tool.tpulab], gcloud). "
        "Repeatable or a comma list: tried in order, the next after a stockout or "
        "quota; `auto` = every zone known to offer the accelerator, cheapest region "
        "first.",
    ),
]
Project = Annotated[
    str | None,
    typer.Option("--project", help="Project (else TPULAB_PROJECT, [tool.tpulab], gcloud, ADC)."),
]
ApiEndpoint = Annotated[
    str | None,
    typer.Option("--api-endpoint", help="Cloud TPU API URL, e.g. `tpulab emulator serve`'s."),
]
PayloadTimeout = Annotated[
    float,
    typer.Option("--payload-timeout", help="Seconds the verifier may run before it is killed."),
]
TeardownTimeout = Annotated[
    float,
    typer.Option("--teardown-timeout", help="Seconds to wait for the deletion to be proven."),
]
BootTimeout = Annotated[
    float,
    typer.Option(
        "--boot-timeout",
        help="Seconds a READY VM may take to publish its host key, and then to accept SSH.",
    ),
]
BootstrapTimeout = Annotated[
    float,
    typer.Option(
        "--bootstrap-timeout", help="Seconds for the VM's venv, uv, python and jax install."
    ),
]
Installer = Annotated[
    str, typer.Option("--installer", help="Remote package installer: uv (default) or pip.")
]
Python = Annotated[
    str | None,
    typer.Option(
        "--python",
        help="The VM venv's python: X.Y (uv-managed; default 3.12, emulated >=3.11), "
        ">=X.Y, or system (the image's 3.10, which limits jax to 0.6.x).",
    ),
]
JaxVersion = Annotated[
    str | None,
    typer.Option("--jax-version", help="Pin jax on the VM (default: the newest)."),
]
ServiceAccount = Annotated[
    str | None,
    typer.Option(
        "--service-account",
        help="The VM's service account (its watchdog needs tpu.nodes.delete); default: "
        "the project's default compute service account.",
    ),
]
Provider = Annotated[
    str | None,
    typer.Option(
        "--provider",
        metavar="tpu-api|compute",
        help="Who makes the VM: the Cloud TPU API (a node) or Compute Engine (an instance "
        "with a TPU machine type; TPU7x needs it). Default: the accelerator's "
        "(docs/reference/providers.md).",
    ),
]
Image = Annotated[
    str | None,
    typer.Option(
        "--image",
        metavar="IMAGE",
        help="With --provider compute: the boot disk's image "
        "(projects/P/global/images/I or .../images/family/F).",
    ),
]
Verbose = Annotated[bool, typer.Option("-v", "--verbose", help="Show remote output live.")]
Network = Annotated[
    str | None,
    typer.Option(
        "--network",
        metavar="VPC",
        help="The VPC network to create the TPU VM in (default: the project's `default`).",
    ),
]
Subnetwork = Annotated[
    str | None,
    typer.Option(
        "--subnetwork",
        metavar="SUBNET",
        help="The subnetwork, in the zone's region (default: the network's own there).",
    ),
]
