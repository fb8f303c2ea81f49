"""The workspace up and the artifacts back over real SSH, on BOTH host backends (the
embedded asyncssh server and OpenSSH's sshd): the real paramiko Connection, the real
transfer script on the emulated host, the host's disk (its sandbox) checked directly."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pytest
from helpers import snapshot, write_tree

from tpulab.errors import RemoteError, RemoteTimeoutError
from tpulab.remote.bootstrap import CommandResult
from tpulab.remote.ssh import Connection
from tpulab.remote.workspace import fetch_artifacts, select_workspace, upload_workspace

if TYPE_CHECKING:
    from ssh_fixtures import SshHost

pytest_plugins = ["ssh_fixtures"]

PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n"


SELECTED = {
    "train.py": b"import jax\nprint(jax.devices())\n",
    "lab/model.py": b"W = 3\n" * 5000,
    "lab/data.bin": os.urandom(2 * 2**20 + 3),
    ".gitignore": b"*.log\noutputs/\n",
    ".tpulabignore": b".env\nkeys/\n",
    "deploy/cert.pem": b"a certificate the VM needs",  # allowed by name
}
LEFT_BEHIND = {
    "debug.log": b"ignored by .gitignore",
    "outputs/old.npz": b"ignored dir",
    ".env": b"TOKEN=secret",  # secret-looking, ignored by .tpulabignore
    "keys/id_ed25519": PEM.encode(),
    ".venv/bin/python": b"always excluded",
    "lab/__pycache__/model.cpython-310.pyc": b"\0",
    ".git/HEAD": b"ref: refs/heads/main",
}


def test_upload_sends_only_the_selected_files_byte_identical(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    root = write_tree(tmp_path / "ws", SELECTED | LEFT_BEHIND)
    # Links to ignored files stay behind with their targets (`ln -s .env config.txt`).
    os.symlink(".env", root / "config.txt")
    os.symlink("../keys/id_ed25519", root / "deploy" / "key")
    selection = select_workspace(root, allow_secrets=["deploy/cert.pem"])
    earlier = write_tree(tmp_path / "earlier", {"stale.py": b"from an earlier sync"})
    with ssh_host.connect() as conn:
        # A file an earlier sync put there and the laptop no longer has: it goes.
        upload_workspace(conn, select_workspace(earlier), "~/work", timeout=60)
        manifest = upload_workspace(conn, selection, "~/work", timeout=60).manifest
    assert snapshot(ssh_host.sandbox / "work") == SELECTED  # the host's own disk
    assert manifest.count == len(SELECTED)
    assert {e.path: e.sha256 for e in manifest.entries} == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in SELECTED.items()
    }
    # No staging or old copy left; the record of what the sync placed stays beside it.
    assert sorted(p.name for p in ssh_host.sandbox.iterdir() if ".tpulab-" in p.name) == [
        ".work.tpulab-synced.json"
    ]


def test_fetch_brings_back_the_run_dir_globs_and_log_byte_identical(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    run = {
        "ckpt/step_8.npz": os.urandom(600_000),
        "metrics.jsonl": b'{"step": 1, "loss": 0.5}\n',
        "device.json": b'{"platform": "cpu"}',
    }
    write_tree(ssh_host.sandbox / ".tpulab/run-1/run", run)
    write_tree(ssh_host.sandbox / "work", {"plots/a.png": b"\x89PNG...", "src/x.py": b"x"})
    (ssh_host.sandbox / ".tpulab/run-1/output.log").write_bytes(b"step 1\nstep 2\n")
    out = tmp_path / "tpulab-runs" / "run-1"
    with ssh_host.connect() as conn:
        manifest = fetch_artifacts(
            conn,
            workspace="work",
            patterns=["plots/*.png", "absent/**"],
            run_dir="~/.tpulab/run-1/run",
            log_path="~/.tpulab/run-1/output.log",
            out=out,
            timeout=60,
        )
    on_disk = snapshot(out)
    recorded = json.loads(on_disk.pop("manifest.json"))
    expected = {f"run/{rel}": data for rel, data in run.items()} | {
        "workspace/plots/a.png": b"\x89PNG...",
        "output.log": b"step 1\nstep 2\n",
    }
    assert on_disk == expected
    assert manifest.missing == ("absent/**",)
    assert recorded["files"] == manifest.to_json_obj()
    assert {e["path"]: e["sha256"] for e in recorded["files"]} == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in expected.items()
    }


class Tampering:
    """A StreamShell between the controller and a real Connection that flips one byte of
    the stream at `offset`: what a corrupting link or a meddling VM would do."""

    def __init__(self, conn: Connection, *, stdin_at: int = -1, stdout_at: int = -1) -> None:
        self.conn = conn
        self.stdin_at = stdin_at
        self.stdout_at = stdout_at

    @staticmethod
    def _flip(chunks: Iterable[bytes], at: int) -> Iterator[bytes]:
        seen = 0
        for chunk in chunks:
            if seen <= at < seen + len(chunk):
                index = at - seen
                chunk = chunk[:index] + bytes([chunk[index] ^ 0x20]) + chunk[index + 1 :]
            seen += len(chunk)
            yield chunk

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        assert stdin is None or isinstance(stdin, Iterable)
        if stdin is not None and self.stdin_at >= 0:
            stdin = self._flip(stdin, self.stdin_at)
        if self.stdout_at < 0 or stdout is None:
            return self.conn.run_streaming(
                argv, stdin=stdin, stdout=stdout, timeout=timeout, env=env
            )
        captured = io.BytesIO()
        result = self.conn.run_streaming(
            argv, stdin=stdin, stdout=captured, timeout=timeout, env=env
        )
        for chunk in self._flip([captured.getvalue()], self.stdout_at):
            stdout.write(chunk)
        return result


def test_a_corrupted_upload_is_refused_and_the_old_workspace_stays(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    root = write_tree(tmp_path / "ws", {"a.bin": os.urandom(100_000), "b.py": b"print()"})
    earlier = write_tree(tmp_path / "earlier", {"previous.py": b"kept"})
    with ssh_host.connect() as conn:
        upload_workspace(conn, select_workspace(earlier), "work", timeout=60)
        with pytest.raises(RemoteError, match=r"refused the workspace upload.*corrupt"):
            upload_workspace(
                Tampering(conn, stdin_at=5000), select_workspace(root), "work", timeout=60
            )
        assert snapshot(ssh_host.sandbox / "work") == {"previous.py": b"kept"}
        upload_workspace(conn, select_workspace(root), "work", timeout=60)  # untouched: fine
    assert snapshot(ssh_host.sandbox / "work") == snapshot(root)


def test_a_corrupted_fetch_is_refused_and_nothing_is_kept(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    write_tree(ssh_host.sandbox / "run", {"weights.bin": b"\x01" * 50_000})
    (ssh_host.sandbox / "out.log").write_bytes(b"log")
    out = tmp_path / "out"
    with ssh_host.connect() as conn:
        kwargs = dict(workspace="work", patterns=[], run_dir="run", log_path="out.log", out=out)
        with pytest.raises(RemoteError, match=r"differ from the VM's manifest: run/weights\.bin"):
            fetch_artifacts(Tampering(conn, stdout_at=3000), timeout=60, **kwargs)  # type: ignore[arg-type]
        assert not out.exists()  # nothing kept, not even an empty --out
        fetch_artifacts(conn, timeout=60, **kwargs)  # type: ignore[arg-type]
    assert (out / "run/weights.bin").read_bytes() == b"\x01" * 50_000


def test_run_streaming_feeds_stdin_returns_status_and_honours_the_timeout(
    ssh_host: SshHost,
) -> None:
    payload = os.urandom(5 * 2**20)
    with ssh_host.connect() as conn:
        echoed = io.BytesIO()
        result = conn.run_streaming(
            ["sh", "-c", "cat; echo done >&2; exit 4"],
            stdin=io.BytesIO(payload),
            stdout=echoed,
            timeout=60,
        )
        assert result.exit_status == 4
        assert result.stderr == "done\n"
        assert echoed.getvalue() == payload  # both directions at once, nothing lost
        with pytest.raises(RemoteTimeoutError, match="was killed"):
            conn.run_streaming(["sleep", "30"], stdin=None, stdout=None, timeout=1.0)
        assert conn.run(["echo", "still here"], timeout=10).stdout == "still here\n"


def test_a_command_that_stops_reading_ends_the_stream_at_once(ssh_host: SshHost) -> None:
    # A VM-side refusal (e.g. an unsafe member) exits without reading the rest: the
    # client must see the status and stop sending, not push the whole workspace first.
    sent: list[int] = []

    def endless() -> Iterator[bytes]:
        while True:
            sent.append(1)
            yield bytes(1 << 20)

    with ssh_host.connect() as conn:
        result = conn.run_streaming(
            ["sh", "-c", "head -c 100 >/dev/null; echo refused >&2; exit 3"],
            stdin=endless(),
            stdout=None,
            timeout=30,
        )
    assert result.exit_status == 3
    assert result.stderr == "refused\n"
    assert len(sent) < 200  # MiB: bounded by the windows and pipes in between
