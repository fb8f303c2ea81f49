"""In a dry run the transfers go through the recording session like every other remote
command: their argv is recorded exactly as a Connection would execute it, the upload is
answered as an empty VM would, the plan ends at the fetch (artifacts exist only after a
real run), and neither the workspace, the VM nor the local --out is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpulab.config import TargetFlags, build_run_spec
from tpulab.remote.cmdline import remote_command
from tpulab.remote.keys import HostKey, SshTarget
from tpulab.remote.workspace import (
    fetch_artifacts,
    fetch_command,
    manifest_command,
    select_workspace,
    unpack_command,
    upload_workspace,
)
from tpulab.run.plan_steps import _PLACEHOLDER_HOST_KEY, PlanEnds
from tpulab.run.recording import PlaceholderKey, PlanRecorder


def test_transfers_are_recorded_with_the_exact_command_and_answered(
    tpulab_home: Path, tmp_path: Path
) -> None:
    spec = build_run_spec(
        target=TargetFlags(accelerator="v6e-1", project="p-123456", zone="us-east5-b"), env={}
    )
    recorder = PlanRecorder(spec)
    session = recorder.connect(
        SshTarget("<NODE-IP>", 22, "tpulab", HostKey("ssh-ed25519", _PLACEHOLDER_HOST_KEY)),
        PlaceholderKey(),
    )
    root = tmp_path / "ws"
    root.mkdir()
    (root / "train.py").write_text("print()")
    selection = select_workspace(root)

    uploaded = upload_workspace(session, selection, "~/work", timeout=60)
    with pytest.raises(PlanEnds, match="only after a real run"):
        fetch_artifacts(
            session,
            workspace="~/work",
            patterns=["ckpt/**"],
            run_dir="~/run",
            log_path="~/out.log",
            out=tmp_path / "runs" / "out",
            timeout=60,
        )

    # The plan answers as a VM that received the selection (so the phases after it run).
    assert [e.path for e in uploaded.manifest.entries] == ["train.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]  # no --out, no staging
    listing, up, down = (step for step in recorder.steps if step.action == "exec")
    # The VM's manifest is asked for first, through the same seam, answered as a fresh VM
    # (nothing there), so the whole selection streams and no --keep list goes with it.
    assert listing.argv == manifest_command("~/work")
    assert listing.command == remote_command(manifest_command("~/work"), timeout=60)
    assert listing.detail is not None
    assert "lists what it holds" in listing.detail
    assert uploaded.sent == uploaded.manifest
    assert (uploaded.unchanged, uploaded.removed) == (0, 0)
    assert up.argv == unpack_command("~/work")
    assert up.command == remote_command(unpack_command("~/work"), timeout=60)
    pack = fetch_command(
        workspace="~/work",
        patterns=["ckpt/**"],
        run_dir="~/run",
        log_path="~/out.log",
        max_bytes=2**30,
    )
    assert down.argv == pack
    assert down.command == remote_command(pack, timeout=60)


def test_the_inline_script_fits_one_command_line_argument() -> None:
    # sshd hands the whole line to the login shell as ONE argument; Linux caps a single
    # argument at 128 KiB (MAX_ARG_STRLEN). Keep well under it, quoting included.
    line = remote_command(unpack_command("~/work"), timeout=60)
    assert len(line) < 64 * 1024
