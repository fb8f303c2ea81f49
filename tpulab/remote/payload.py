"""How the verifier payload is invoked, shared by the local run and the remote lifecycle,
and how a run's payload left running on a VM is stopped.

One builder for the argv and one for the environment, so `tpulab verify --local` and
`tpulab run` start the payload the same way: the platform named twice (JAX_PLATFORMS, so
JAX cannot fall back, and --platform, so the payload asks for it by name) and, on CPU, the
device count forced to what the accelerator would show.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tpulab.errors import ConfigError

__all__ = [
    "COORDINATOR_PORT",
    "PAYLOAD_NAME",
    "PAYLOAD_STOP_MARKER",
    "RECEIPT_PREFIX",
    "SliceRole",
    "check_nonce",
    "extract_receipt_line",
    "merged_env",
    "payload_command",
    "payload_env",
    "stop_payload_command",
    "stopped_payloads",
]

PAYLOAD_NAME = "verify_tpu.py"
RECEIPT_PREFIX = "TPULAB_RECEIPT "
_PLATFORMS = ("cpu", "tpu", "gpu")
_NONCE_CHARS = frozenset(string.ascii_letters + string.digits + "-_")
# The port worker 0's jax.distributed coordinator listens on, online. The payload is given
# the address explicitly, so any free port works; this is the one jax's own Cloud TPU
# cluster detection picks in jax 0.6.2, the newest jax for the Python 3.10 of TPU VM
# images (`coordinator_port = '8476'` in jax/_src/clusters/cloud_tpu_cluster.py; jax
# 0.10.2 moved it to '8482'), so a TPU VM's firewall rules for jax's default fit it.
COORDINATOR_PORT = 8476
_MAX_PORT = 65535


@dataclass(frozen=True)
class SliceRole:
    """Which worker of a multi-host slice a payload run is, and how it finds the others.

    `coordinator` is "host:port" of worker 0's jax.distributed service; `init_timeout`
    (seconds) bounds every wait on the peers, the join first.
    """

    hosts: int
    process_id: int
    coordinator: str
    init_timeout: int

    def __post_init__(self) -> None:
        if self.hosts < 2:
            raise ConfigError(
                f"A slice role needs 2 or more hosts, not {self.hosts}.",
                hint="A single host runs the payload without a slice role.",
            )
        if not 0 <= self.process_id < self.hosts:
            raise ConfigError(
                f"Process id {self.process_id} is not a worker of a {self.hosts}-host slice.",
                hint=f"Use 0 .. {self.hosts - 1}.",
            )
        _check_coordinator(self.coordinator)
        if self.init_timeout < 1:
            raise ConfigError(
                f"Invalid distributed init timeout {self.init_timeout} s.",
                hint="Give the workers at least a second (minutes on a real slice).",
            )

    def argv(self) -> list[str]:
        return [
            "--hosts",
            str(self.hosts),
            "--process-id",
            str(self.process_id),
            "--coordinator",
            self.coordinator,
            "--init-timeout",
            str(self.init_timeout),
        ]


def _check_coordinator(address: str) -> None:
    """host:port, as jax.distributed.initialize takes it (an IPv6 host in brackets)."""
    host, colon, port = address.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    problem = None
    if not colon or not host:
        problem = "it is not host:port"
    elif not bare or any(c.isspace() for c in bare) or ("[" in bare or "]" in bare):
        problem = f"the host {host!r} is not a host name or address"
    elif not port.isdecimal() or not 1 <= int(port) <= _MAX_PORT:
        problem = f"the port {port!r} is not 1-{_MAX_PORT}"
    if problem is not None:
        raise ConfigError(
            f"Invalid coordinator address {address!r}: {problem}.",
            hint=f"Use worker 0's internal address and a port, e.g. 10.0.0.2:{COORDINATOR_PORT}.",
        )


def _check_platform(platform: str) -> str:
    if platform not in _PLATFORMS:
        raise ConfigError(
            f"Unknown platform {platform!r}.", hint="Use one of: " + ", ".join(_PLATFORMS)
        )
    return platform


def check_nonce(nonce: str) -> str:
    """Nonces travel on a command line; keep them to a harmless alphabet and length."""
    if not 8 <= len(nonce) <= 128 or not set(nonce) <= _NONCE_CHARS:
        raise ConfigError(
            f"Invalid nonce {nonce!r}.",
            hint="Use 8-128 characters of letters, digits, '-' or '_' (secrets.token_hex).",
        )
    return nonce


def payload_command(
    python: str,
    payload: str | Path,
    *,
    platform: str,
    nonce: str,
    out: str | Path,
    emulated: bool,
    slice_role: SliceRole | None = None,
) -> list[str]:
    """argv that runs the payload; `out` is where it writes the receipt JSON. With a
    `slice_role` it is one worker of a slice; without, exactly the single-host argv."""
    argv = [
        python,
        str(payload),
        "--platform",
        _check_platform(platform),
        "--nonce",
        check_nonce(nonce),
        "--out",
        str(out),
    ]
    if emulated:
        argv.append("--emulated")
    return [*argv, *slice_role.argv()] if slice_role is not None else argv


def payload_env(platform: str, devices: int) -> dict[str, str]:
    """Environment additions for the payload process (merge them over the inherited env).

    On CPU the device count comes from XLA's host-platform flag, so an emulated
    v5litepod-4 shows 4 devices; on a TPU the hardware decides and the flag is not set.
    """
    if devices < 1:
        raise ConfigError(f"Invalid device count {devices}.", hint="Use 1 or more devices.")
    env = {"JAX_PLATFORMS": _check_platform(platform)}
    if platform == "cpu":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def extract_receipt_line(output: bytes | str) -> bytes | None:
    """The receipt from the payload's stdout (last prefixed line), or None."""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    found: str | None = None
    for line in text.splitlines():
        if line.startswith(RECEIPT_PREFIX):
            found = line[len(RECEIPT_PREFIX) :]
    return found.encode("utf-8") if found is not None else None


def merged_env(base: Mapping[str, str], platform: str, devices: int) -> dict[str, str]:
    """`base` with the payload's settings on top (replacing any inherited XLA_FLAGS)."""
    return {**base, **payload_env(platform, devices)}


PAYLOAD_STOP_MARKER = "TPULAB_PAYLOAD_STOP "
# Kill (SIGKILL) every process whose argv holds `--nonce NONCE`: a run's payload, which
# nothing else carries (the nonce is the run's own), left running on the VM when the SSH
# connection it was started over dropped. This script's own argv holds the nonce alone,
# not after --nonce. Then up to argv[2] seconds for them to be gone (or zombies), so a
# payload started next finds the TPU free; the image's python3 (3.10 on TPU VM images).
_STOP_PAYLOAD_SCRIPT = r"""
import os, signal, sys, time
nonce, wait_for = sys.argv[1].encode(), float(sys.argv[2])
killed = []
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        with open("/proc/%s/cmdline" % name, "rb") as handle:
            args = handle.read().split(b"\0")
    except OSError:
        continue
    if any(a == b"--nonce" and b == nonce for a, b in zip(args, args[1:])):
        try:
            os.kill(int(name), signal.SIGKILL)
            killed.append(name)
        except OSError:
            pass

def gone(pid):
    try:
        with open("/proc/%s/stat" % pid) as handle:
            state = handle.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")

deadline = time.monotonic() + wait_for
while not all(gone(pid) for pid in killed) and time.monotonic() < deadline:
    time.sleep(0.1)
print("TPULAB_PAYLOAD_STOP " + (",".join(killed) or "-"))
"""


def stop_payload_command(nonce: str, *, wait_seconds: int = 10) -> list[str]:
    """argv that stops the payload run with `nonce`, if it still runs (see the script)."""
    return ["python3", "-c", _STOP_PAYLOAD_SCRIPT, check_nonce(nonce), str(wait_seconds)]


def stopped_payloads(output: str) -> list[int] | None:
    """The pids the stop killed, from its output; None when it did not report."""
    for line in output.splitlines():
        if line.startswith(PAYLOAD_STOP_MARKER):
            said = line[len(PAYLOAD_STOP_MARKER) :].strip()
            return [] if said == "-" else [int(pid) for pid in said.split(",") if pid.isdigit()]
    return None
