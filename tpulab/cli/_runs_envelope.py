"""`tpulab runs list --json`'s envelope, in its own module so that importing
tpulab.cli.runs (which `tpulab --help` does, to list the commands) does not load
pydantic and the run record's model: only `runs list --json` needs them."""

from __future__ import annotations

from typing import Literal

from tpulab.envelope import Envelope
from tpulab.run.record import RunRecord

__all__ = ["RunsListEnvelope"]


class RunsListEnvelope(Envelope):
    """`tpulab runs list --json`: each record, or why it could not be read."""

    command: Literal["runs list"] = "runs list"
    runs: list[RunRecord]
    unreadable: dict[str, str]  # run id -> what is wrong with its run.json
    # Run ids whose record still says "running" but whose process is gone: killed
    # (SIGKILL, power loss) before the end could replace it. Their artifacts, if any,
    # are in the record's workload.out.
    interrupted: list[str]
