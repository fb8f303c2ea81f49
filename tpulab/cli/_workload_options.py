"""The workload flags `tpulab run ... -- CMD` and `tpulab exec` share, declared once so
their names, metavars and help cannot drift apart (config.WorkloadFlags takes them)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = [
    "AllOutput",
    "AllowSecret",
    "Env",
    "Exclude",
    "Fetch",
    "MaxFetch",
    "MaxUpload",
    "Out",
    "Quiet",
    "Requirements",
    "Timeout",
    "WithPackages",
    "Workdir",
]

Workdir = Annotated[
    str | None,
    typer.Option(
        "--workdir",
        help="The workspace sent to the VM for your command, and where [tool.tpulab] "
        "is read (default: the current directory).",
    ),
]
WithPackages = Annotated[
    list[str] | None,
    typer.Option(
        "--with", metavar="PKG", help="Install PKG into the VM's venv after jax (repeatable)."
    ),
]
Requirements = Annotated[
    str | None,
    typer.Option("--requirements", metavar="FILE", help="Install FILE's requirements after jax."),
]
Fetch = Annotated[
    list[str] | None,
    typer.Option(
        "--fetch",
        metavar="PATH",
        help="Bring PATH (workspace-relative, globs) back after the command (repeatable).",
    ),
]
Exclude = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude",
        metavar="PATTERN",
        help="Do not upload what PATTERN (gitignore syntax, workspace-relative) matches, "
        "after [tool.tpulab] exclude (repeatable), e.g. --exclude 'data/*.bin' "
        "--exclude checkpoints/.",
    ),
]
Out = Annotated[
    str | None,
    typer.Option(
        "--out", metavar="DIR", help="Where artifacts land (default ./tpulab-runs/<run id>/)."
    ),
]
Env = Annotated[
    list[str] | None,
    typer.Option("--env", metavar="K=V", help="Set K=V for your command (repeatable)."),
]
Timeout = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        help="Seconds your command (after --) may run before it is killed remotely (default 3600).",
    ),
]
MaxUpload = Annotated[
    str | None,
    typer.Option("--max-upload", metavar="SIZE", help="Refuse a bigger workspace (default 256M)."),
]
MaxFetch = Annotated[
    str | None,
    typer.Option("--max-fetch", metavar="SIZE", help="Cap on what comes back (default 1G)."),
]
AllowSecret = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-secret",
        metavar="PATH",
        help="Upload PATH although it looks like a secret (repeatable).",
    ),
]
Quiet = Annotated[
    bool,
    typer.Option("-q", "--quiet", help="Only log your command's output; do not stream it."),
]
AllOutput = Annotated[
    bool,
    typer.Option(
        "--all-output",
        help="On a multi-host slice, stream every worker's output, each line prefixed with "
        "its worker (w3 ┃ ...); by default only worker 0's streams and the others' are in "
        "their output.log, fetched into <out>/worker-N/.",
    ),
]
