"""The dry run's SSH session: records the exact command line `tpulab.remote.ssh.Connection`
would execute for each run and each transfer, and answers as a freshly booted image would
(tpulab.run.recording composes it into a plan)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from tpulab.remote import bootstrap as boot
from tpulab.remote import workload as wl
from tpulab.remote.cmdline import SHA256_TIMEOUT, remote_command, remote_path, sha256_command
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.remote.tpu_release import RELEASE_MARKER, release_command
from tpulab.remote.workspace import planned_answer
from tpulab.run.plan_steps import (
    PLACEHOLDER_FROM_VM,
    PLACEHOLDER_NONCE,
    PLACEHOLDER_PUBLIC_KEY,
    PLACEHOLDER_REMOTE_HOME,
    PLACEHOLDER_SSH_PORT,
    PlanEnds,
    StepSink,
)
from tpulab.run.progress import Phase

__all__ = ["RecordingSession"]


class _Reply:
    """What a command printed, as `boot.CommandResult`."""

    def __init__(self, stdout: str = "", exit_status: int = 0, stderr: str = "") -> None:
        self.exit_status = exit_status
        self.stdout = stdout
        self.stderr = stderr


class _Held:
    """What a held command printed first, as `wl.HeldAnswer`: it runs on (no status)."""

    def __init__(self, stdout: str) -> None:
        self.exit_status: int | None = None
        self.stdout = stdout
        self.stderr = ""


class RecordingSession:
    """A RemoteSession that records the command lines a `Connection` would execute.

    Answers as a fresh image would: the bootstrap's scripts report success, a real TPU
    image has no jax until the install ran (an emulated image ships it), the payload
    exits 0. The receipt download ends the plan (`PlanEnds`).
    """

    def __init__(self, recorder: StepSink, target: SshTarget, key: RunKey) -> None:
        self.recorder = recorder
        self.target = target
        self.key = key
        self.installed = recorder.spec.emulated

    def _target_text(self) -> str:
        port = PLACEHOLDER_SSH_PORT if self.recorder.spec.emulated else str(self.target.port)
        return f"{self.target.user}@{self.target.host}:{port}"

    def open(self) -> None:
        self.recorder.add(
            "ssh",
            "connect",
            target=self._target_text(),
            detail=f"authenticates with the run's key ({PLACEHOLDER_PUBLIC_KEY}); trusts only "
            f"the {self.target.host_key.key_type} host key the API published (any other "
            "aborts before anything is sent)",
        )

    def close(self) -> None:
        pass

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        on_line: Callable[[str, str], None] | None = None,
        check: bool = False,
    ) -> _Reply:
        command = remote_command(argv, env=env, timeout=timeout)
        self.recorder.add(
            "ssh",
            "exec",
            argv=None if isinstance(argv, str) else list(argv),
            env=dict(env) if env else None,
            command=command,
        )
        return self._reply(argv)

    def hold(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        answer_within: float,
        beat_every: float | None = None,
    ) -> _Held:
        # All but the holder's note (this run, laptop and pid) and the silence it lets go
        # after is the lock's argv.
        is_lock = list(argv[:-2]) == wl.lock_command(run_id="", host="", pid=0)[:-2]
        what = (
            f"takes the session's exec lock (flock on ~/{wl.LOCK_PATH}, noting this run, "
            "laptop and pid) or says who holds it -- then the exec is refused, nothing "
            "synced or started; "
            if is_lock
            else ""
        )
        self.recorder.add(
            "ssh",
            "exec",
            argv=list(argv),
            command=remote_command(argv, timeout=timeout),
            detail=f"{what}answers within {answer_within:g}s, then stays running, its "
            "stdin open, until the connection closes (the exec's end, or the laptop's)"
            + (
                f" or {argv[-1]}s pass without the heartbeat byte sent every {beat_every:g}s"
                if beat_every is not None
                else ""
            )
            + ": what it holds goes with it",
        )
        return _Held(wl.LOCKED_REPORT if is_lock else "")  # an idle node: the lock is free

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> _Reply:
        command = remote_command(argv, env=env, timeout=timeout)
        argv = list(argv)
        # A transfer (tpulab.remote.workspace's script) or not; which way it goes.
        verb = argv[3] if planned_answer(argv) is not None else None
        detail = None
        answer = b""
        if verb == "unpack" and stdin is not None:
            # Read the archive a run would stream, so the plan lists what would go up.
            entries = _archive_manifest(stdin)
            total = sum(entry["bytes"] for entry in entries)
            names = ", ".join(entry["path"] for entry in entries[:20])
            more = f", ... and {len(entries) - 20} more" if len(entries) > 20 else ""
            detail = (
                f"streams {len(entries)} files, {total} bytes as one tar on stdin "
                f"(sha256 trailer; the VM checks each file): {names}{more}"
            )
            answer = json.dumps({"manifest": entries}).encode()
        elif verb == "pack":
            detail = "the VM streams back one tar of these, checked file by file into --out"
        elif verb is not None:  # `manifest`: what the VM holds decides what goes up
            detail = "the VM lists what it holds (path, bytes, sha256); a fresh VM: nothing"
            answer = planned_answer(argv) or b""
        self.recorder.add(
            "ssh",
            "exec",
            argv=argv,
            env=dict(env) if env else None,
            command=command,
            detail=detail,
        )
        if verb == "pack":
            raise PlanEnds("the artifacts exist only after a real run")
        if stdout is not None and answer:
            stdout.write(answer)
        return _Reply()

    def _reply(self, argv: Sequence[str] | str) -> _Reply:
        if isinstance(argv, str):
            return _Reply()
        argv = list(argv)
        spec = self.recorder.spec
        if argv in (boot.venv_command(i, spec.python) for i in boot.INSTALLERS):
            return _Reply(boot.VENV_MARKER + PLACEHOLDER_FROM_VM + "\n")
        if argv == boot.probe_command():
            have = PLACEHOLDER_FROM_VM if self.installed else None
            names = ("jax", "jaxlib", "numpy", "libtpu")
            versions = {name: have for name in names} | {"python": PLACEHOLDER_FROM_VM}
            if self.installed and spec.jax_version:
                versions["jax"] = spec.jax_version  # what a pinned install resolves
            return _Reply(boot.VERSIONS_MARKER + json.dumps(versions) + "\n")
        if argv[:2] == ["sh", "-c"] and any(
            argv == boot.install_command(spec.platform, i, spec.jax_version)
            for i in boot.INSTALLERS
        ):
            self.installed = True
            return _Reply(boot.INSTALLER_MARKER + argv[5] + "\n")
        if argv[:3] == boot.extras_command(boot.Extras())[:3]:
            return _Reply(
                boot.INSTALLER_MARKER + argv[5] + "\n" + boot.EXTRAS_MARKER + "installed\n"
            )
        if argv[:3] == boot.probe_command() and len(argv) > 3:
            versions = {name: PLACEHOLDER_FROM_VM for name in argv[3:]}
            return _Reply(
                boot.VERSIONS_MARKER
                + "{}\n"
                + boot.EXTRA_VERSIONS_MARKER
                + json.dumps(versions)
                + "\n"
            )
        if argv == wl.busy_command():  # an exec's check: a kept node where nothing runs
            return _Reply(wl.IDLE_REPORT)
        if argv == release_command():  # a fresh node: nothing holds its TPU
            return _Reply(RELEASE_MARKER + "killed= refused= lockfile=no\n")
        if argv[:2] == [boot.VENV_PYTHON, wl.STAGED_LAUNCHER]:
            report = {"exit_status": 0, "started": True, "timed_out": False, "stopped": None}
            return _Reply(stderr=wl.WORKLOAD_MARKER + json.dumps(report) + "\n")
        return _Reply()

    def _transfer(self, action: str, remote: str) -> None:
        path = remote_path(PLACEHOLDER_REMOTE_HOME, remote)
        check = remote_command(sha256_command(path), timeout=SHA256_TIMEOUT)
        self.recorder.add("ssh", action, remote_path=path, command=check)

    def put(self, local: Path | bytes, remote: str) -> str:
        data = local if isinstance(local, bytes) else local.read_bytes()
        self._transfer("put", remote)
        return hashlib.sha256(data).hexdigest()  # what the check would find

    def read(self, remote: str, *, max_bytes: int) -> bytes:
        from tpulab.evidence.receipt import expectation_for

        self._transfer("get", remote)
        spec = self.recorder.spec
        expectation = expectation_for(
            spec.accelerator.name, emulated=spec.emulated, nonce=PLACEHOLDER_NONCE
        )
        self.recorder.local(
            f"judge the receipt (at most {max_bytes} bytes): {expectation.describe()}, "
            "nonce, sha256, numbers against the closed form; keep it in the receipt store "
            "before the teardown starts",
            phase=Phase.VERIFY.value,
        )
        if spec.workload is None:
            raise PlanEnds("the receipt exists only after a real run")
        # With a command the plan goes on (to the recorder's judge), which reads no bytes.
        return b""


class _ChunkReader:
    """A read()-able view of the chunks a transfer would stream, for tarfile's "r|"."""

    def __init__(self, stream: BinaryIO | Iterable[bytes]) -> None:
        self._stream = stream
        self._chunks = None if hasattr(stream, "read") else iter(stream)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        if self._chunks is None:
            return self._stream.read(size)  # type: ignore[union-attr]
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        cut = len(self._buffer) if size < 0 else size
        data, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return data


def _archive_manifest(stream: BinaryIO | Iterable[bytes]) -> list[dict[str, Any]]:
    """What the VM's unpacker would answer: each regular file's path, size and sha256."""
    import tarfile

    entries: list[dict[str, Any]] = []
    with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as archive:  # type: ignore[call-overload]
        for member in archive:
            if not member.isfile():
                continue
            content = archive.extractfile(member)
            digest = hashlib.sha256(content.read() if content else b"").hexdigest()
            entries.append({"path": member.name, "bytes": member.size, "sha256": digest})
    return entries
