"""tpulab's watchdog: the TPU VM deletes itself when its controller is gone or too late.

Runs ON the TPU VM (Python 3.10, stdlib only; it never imports tpulab and holds no
secret). The node's `startup-script`, built by `tpulab.remote.watchdog`, pipes this file
into `python3 - --config JSON` at boot; it daemonises at once, so the boot script runner
is not held up, and then:

1. learns who it is from the metadata server (`instance/attributes/tpu-env`: NODE_ID,
   ZONE, CONSUMER_PROJECT_ID) and refuses to act for any other node than the one its
   config names;
2. proves it may delete that node: Resource Manager v1 `projects/P:testIamPermissions`
   for `tpu.nodes.delete` (a queued node: and `tpu.queuedresources.delete`, for its
   queued resource), with the VM service account's token from the metadata server.
   It publishes the answer as the guest attribute `tpulab/watchdog`:
   `armed`, `unverified: ...` (the check itself was refused: armed, but unproven),
   `no-permission: ...` or `error: ...`;
3. publishes the lease as the guest attribute `tpulab/lease`, JSON `{"renewed_at":
   EPOCH, "lease_seconds": S, "renewals": N}` -- at its start (the boot grace standing in
   for the lease) and at every renewal it sees -- so `tpulab teardown --verify` on another
   machine can tell live work (a fresh lease) from a node left behind;
4. every `poll_seconds` checks the lease and the hard deadline, and when either passed
   publishes `firing: lease expired` / `firing: deadline` and sends the DELETEs its
   config lists (`delete_paths`; by default `v2/projects/P/locations/Z/nodes/N`) with
   the token, retrying transient failures; 404 means it is already going, which is all
   it wanted. A node made by a queued resource lists that first, with `force=true`, so
   the queued resource goes with its node (deleting only the node would leave it
   SUSPENDED and holding quota), then the node itself. Every path must name this VM's
   own project, zone and node name (the queued resource is named like its node).
   A Compute Engine instance (config `provider: compute`) is deleted at the config's
   `api_base` (https://compute.googleapis.com/) with
   `DELETE compute/v1/projects/P/zones/Z/instances/N`, which needs
   `compute.instances.delete`; it learns its name from `instance/name` (no tpu-env);
5. every poll reads `instance/preempted` and, once it says TRUE (GCE is stopping this
   spot VM), publishes the guest attribute `tpulab/preempted` = `TRUE`, once. It deletes
   nothing for it: the VM is going anyway, and the controller recovers elsewhere.

The lease: the controller writes the lease file over its SSH session every few seconds
(a new line each time; `{"seq": n, "lease_seconds": s}`). The watchdog does not trust
clocks: a renewal is a change of the file's content, seen at this machine's monotonic
time, and the lease runs `lease_seconds` from that moment. Until the first renewal the
boot grace (counted from the watchdog's start) stands in for it. The hard deadline is
`max_duration_seconds` after the watchdog's start, whatever the lease says. Both are
measured with time.monotonic, so an NTP step at boot cannot fire it early (the emulator
may move that clock forward for a test: vm_clock). "The watchdog's start" is the run's
FIRST boot: its wall-clock time is kept on the VM's disk (remember_first_boot), so a
reboot that runs the startup-script again restarts neither the grace nor the deadline.

Real-GCP assumptions (each is where the emulator imitates the real VM):
- The guest agent runs metadata `startup-script` at boot as root: it writes the value to
  a 0755 file in a temporary directory and runs it with `/bin/bash -c FILE`, so the
  `#!` line is honoured (GoogleCloudPlatform/guest-agent
  google_metadata_script_runner/main.go, runScript/writeScriptToFile); it reads the
  script's stdout/stderr pipe to EOF before the service ends, so a daemon must not keep
  them (runCmd), and the unit is `Type=oneshot` with `KillMode=process`, so a daemon that
  left the script's process group survives the script (google-startup-scripts.service).
- The metadata server is `metadata.google.internal` (or $GCE_METADATA_HOST, the
  override google-auth honours: google/auth/compute_engine/_metadata.py), requires the
  header `Metadata-Flavor: Google`, serves `instance/service-accounts/default/token`
  (an OAuth access token with the VM service account's scopes) and accepts
  `PUT instance/guest-attributes/NAMESPACE/KEY` when the instance metadata says
  `enable-guest-attributes: TRUE` (the controller sets it).
- `DELETE https://tpu.googleapis.com/v2/{name=projects/*/locations/*/nodes/*}` deletes a
  node; the caller needs `tpu.nodes.delete` (roles/tpu.admin has it) and a token with the
  cloud-platform scope (Cloud TPU REST reference, projects.locations.nodes.delete).
- `POST https://cloudresourcemanager.googleapis.com/v1/projects/P:testIamPermissions`
  with `{"permissions": [...]}` answers the subset the caller holds; it needs no
  permission of its own (Resource Manager v1 reference), but the API may be disabled in
  the project, which is why a refusal reads "unverified", not "no permission".
- The lease file lives in /tmp: root runs this script while the controller writes as the
  SSH user, and /tmp (sticky, world-writable) is the directory both can use. The
  watchdog only reads it; the controller creates and replaces it (write + rename), so
  no root-owned file can stand in the user's way. Each worker VM of a multi-host slice
  has its own /tmp, so the controller renews the lease on every worker; the emulator,
  whose workers share one machine, gives each its own directory for /tmp (TMP_ENV).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

# The overrides only the emulator sets (tpulab.contract names them too); on a real VM
# they are unset and the Google endpoints below are used.
METADATA_HOST_ENV = "GCE_METADATA_HOST"
TPU_API_BASE_ENV = "TPULAB_TPU_API_BASE"
RESOURCE_MANAGER_BASE_ENV = "TPULAB_RESOURCE_MANAGER_BASE"
# Set by the emulator only (tpulab.contract.EMULATED_CLOCK_SKIP_ENV): see vm_clock.
CLOCK_SKIP_ENV = "TPULAB_EMULATED_CLOCK_SKIP"
# Set by the emulator only (tpulab.contract.EMULATED_TMP_ENV): this worker's own /tmp,
# as each real worker VM of a slice has one. See Config.on_this_vm.
TMP_ENV = "TPULAB_EMULATED_TMP"
VM_TMP = "/tmp/"
# Set by the emulator only (tpulab.contract.EMULATED_DISK_ENV): the directory standing in
# for this VM's root disk, under which FIRST_BOOT_DIR lives (see first_boot_path).
DISK_ENV = "TPULAB_EMULATED_DISK"
# On the VM's disk, not in /tmp (which a reboot may clear): root writes it at the first
# boot, and every later boot of the same run reads it back.
FIRST_BOOT_DIR = "/var/lib/tpulab"
METADATA_HOST = "metadata.google.internal"
TPU_API_BASE = "https://tpu.googleapis.com/"
COMPUTE_API_BASE = "https://compute.googleapis.com/"
RESOURCE_MANAGER_BASE = "https://cloudresourcemanager.googleapis.com/"

STATE_NAMESPACE = "tpulab"
STATE_KEY = "watchdog"
# The lease as the watchdog last saw it (tpulab.contract.LEASE_ATTRIBUTE): when it was
# last renewed (this VM's wall clock) and for how long, so that tpulab on another
# machine can tell a node in use from one left behind.
LEASE_KEY = "lease"
DELETE_PERMISSION = "tpu.nodes.delete"
# A queued node's first DELETE is its queued resource's (tpulab.contract
# .DELETE_QUEUED_RESOURCE_PERMISSION; IAM spells the resource all lower case).
QUEUED_DELETE_PERMISSION = "tpu.queuedresources.delete"
# `instance/preempted` says TRUE once GCE preempts this spot VM; the watchdog passes it on
# as the guest attribute tpulab/preempted = TRUE (tpulab.contract.PREEMPTED_ATTRIBUTE).
PREEMPTED_KEY = "preempted"
PREEMPTED = "TRUE"
COMPUTE_DELETE_PERMISSION = "compute.instances.delete"
COMPUTE = "compute"  # Config.provider of a Compute Engine instance
# What the controller reads back (tpulab.remote.watchdog parses the same prefixes).
ARMED = "armed"
UNVERIFIED = "unverified: "
NO_PERMISSION = "no-permission: "
ERROR = "error: "
FIRING = "firing: "
LEASE_EXPIRED = "lease expired"
DEADLINE = "deadline"

HTTP_TIMEOUT = 10.0
# Once every DELETE is accepted (or its target already gone), how long before they are
# sent again: only a node whose delete operation failed is still here to receive them.
DELETE_AGAIN_SECONDS = 30.0
# Guest attribute values are small; keep every published text well inside them.
MAX_STATE_CHARS = 500


@dataclass(frozen=True)
class Config:
    """What the controller embeds in the startup-script (none of it secret)."""

    run_id: str
    node_name: str
    zone: str
    project: str
    lease_path: str
    log_path: str
    pid_path: str
    lease_seconds: float
    boot_grace_seconds: float
    max_duration_seconds: float
    poll_seconds: float
    delete_paths: tuple[str, ...] = ()  # empty: this node's own DELETE only
    # Absent from a TPU API node's config (whose JSON is unchanged): "tpu-api", and the
    # API root from the environment or TPU_API_BASE.
    provider: str = "tpu-api"
    api_base: str = ""

    def on_this_vm(self, emulated_tmp: str | None) -> Config:
        """The config with its files where this VM keeps them. The config names them in
        /tmp, as on a real VM, where nothing changes; an emulated worker's /tmp is the
        directory `emulated_tmp` (TMP_ENV), so that each worker of an emulated slice
        reads its own lease, as each real worker does. The controller's renew script
        (tpulab.remote.watchdog.renew_command) resolves the lease path the same way."""
        if not emulated_tmp:
            return self

        def moved(path: str) -> str:
            if not path.startswith(VM_TMP):
                return path
            return os.path.join(emulated_tmp, path[len(VM_TMP) :])

        return replace(
            self,
            lease_path=moved(self.lease_path),
            log_path=moved(self.log_path),
            pid_path=moved(self.pid_path),
        )

    @property
    def delete_permission(self) -> str:
        return COMPUTE_DELETE_PERMISSION if self.provider == COMPUTE else DELETE_PERMISSION

    @property
    def permissions(self) -> list[str]:
        """What the watchdog must hold to delete all it lists: the node's (or instance's)
        delete, and a queued resource's when it lists one (only then, so a plain node's
        permission check is what it always was)."""
        queued = any("/queuedResources/" in path for path in self.delete_paths)
        return [self.delete_permission] + ([QUEUED_DELETE_PERMISSION] if queued else [])

    @classmethod
    def from_json(cls, text: str) -> Config:
        data = json.loads(text)
        return cls(
            run_id=str(data["run_id"]),
            node_name=str(data["node_name"]),
            zone=str(data["zone"]),
            project=str(data["project"]),
            lease_path=str(data["lease_path"]),
            log_path=str(data["log_path"]),
            pid_path=str(data["pid_path"]),
            lease_seconds=_positive(data["lease_seconds"]),
            boot_grace_seconds=_positive(data["boot_grace_seconds"]),
            max_duration_seconds=_positive(data["max_duration_seconds"]),
            poll_seconds=_positive(data["poll_seconds"]),
            delete_paths=tuple(str(p) for p in data.get("delete_paths") or ()),
            provider=str(data.get("provider") or "tpu-api"),
            api_base=str(data.get("api_base") or ""),
        )


def _positive(value: Any) -> float:
    number = float(value)
    if not 0 < number < 10**7:
        raise ValueError(f"expected a positive number of seconds, got {value!r}")
    return number


def vm_clock(skip_path: str | None) -> Callable[[], float]:
    """This VM's monotonic clock. On the emulator, `skip_path` (CLOCK_SKIP_ENV) names a
    file holding how far the emulated VM's clock was moved forward: a test reaches a
    deadline minutes away without waiting minutes. The clock never goes back, whatever
    the file says (a missing or unreadable file reads as the last value seen)."""
    if not skip_path:
        return time.monotonic
    skipped = [0.0]

    def clock() -> float:
        try:
            with open(skip_path, encoding="utf-8") as handle:
                skipped[0] = max(skipped[0], float(handle.read().strip() or 0))
        except (OSError, ValueError):
            pass
        return time.monotonic() + skipped[0]

    return clock


def vm_wall_clock(skip_path: str | None) -> Callable[[], float]:
    """This VM's wall clock (time.time), moved forward as vm_clock is on the emulator."""
    if not skip_path:
        return time.time
    monotonic = vm_clock(skip_path)
    return lambda: time.time() + (monotonic() - time.monotonic())


def first_boot_path(run_id: str, disk: str | None) -> str:
    """Where this run's first boot is remembered: on the VM's disk, or under the emulated
    VM's own directory standing in for it (each emulated VM has its own)."""
    directory = (disk.rstrip("/") + FIRST_BOOT_DIR) if disk else FIRST_BOOT_DIR
    return os.path.join(directory, f"first-boot-{run_id}")


def remember_first_boot(path: str, now: float, log: Callable[[str], None]) -> float:
    """The wall-clock time (epoch seconds) of this run's first boot: read back when an
    earlier boot wrote it, else `now`, written for later boots.

    Wall clock, not monotonic: a monotonic clock starts again at every boot, so only the
    wall clock compares across a reboot (an NTP step between boots moves the deadline by
    the step; the decisions within one boot stay monotonic). A file that cannot be read or
    written is logged and this boot counts as the first: the watchdog still guards."""
    try:
        with open(path, encoding="utf-8") as handle:
            found = float(json.loads(handle.read())["first_boot"])
        if 0 < found < 10**11:
            return found
        log(f"ignoring {path}: first boot {found!r} is not a time")
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, KeyError) as error:
        log(f"ignoring {path}: {type(error).__name__}: {error}")
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        partial = f"{path}.partial"
        with open(partial, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"first_boot": now}) + "\n")
        os.replace(partial, path)  # whole or not at all: a reboot may come at any moment
    except OSError as error:
        log(f"cannot remember the first boot in {path} ({error}); a reboot restarts the clock")
    return now


class HttpError(Exception):
    """An HTTP answer that is not 2xx (status 0: no answer at all)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        return self.status in (0, 408, 429) or self.status >= 500


def _root(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def request(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = HTTP_TIMEOUT,
) -> bytes:
    """One HTTP request; its body, or HttpError (status 0 for network failures)."""
    if not url.startswith(("http://", "https://")):
        raise HttpError(0, f"not an http(s) URL: {url!r}")
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:  # noqa: S310
            return bytes(answer.read())
    except urllib.error.HTTPError as error:
        raise HttpError(error.code, _error_text(error.read())) from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise HttpError(0, f"{type(error).__name__}: {reason}") from None


def _error_text(body: bytes) -> str:
    """A Google error body's message, else the start of the body."""
    text = body.decode("utf-8", "replace")
    try:
        found = json.loads(text).get("error", {})
        if isinstance(found, dict) and found.get("message"):
            return f"{found.get('status') or found.get('code')}: {found['message']}"
    except (ValueError, AttributeError):
        pass
    return text.strip()[:300] or "(no body)"


def parse_tpu_env(text: str) -> dict[str, str]:
    """`tpu-env`'s `KEY: 'value'` lines (YAML-like, one per line) as a dict."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or not key.strip() or key.startswith((" ", "#")):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[key.strip()] = value
    return found


class Metadata:
    """The VM's metadata server: identity, the service account's token, guest attributes."""

    def __init__(self, host: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.base = f"http://{host}/computeMetadata/v1/"
        self.clock = clock
        self._token = ""
        self._token_until = 0.0

    def get(self, path: str) -> str:
        headers = {"Metadata-Flavor": "Google"}
        return request("GET", self.base + path, headers=headers).decode("utf-8").strip()

    def put_guest_attribute(self, namespace: str, key: str, value: str) -> None:
        url = f"{self.base}instance/guest-attributes/{namespace}/{key}"
        headers = {"Metadata-Flavor": "Google", "Content-Type": "text/plain"}
        request("PUT", url, headers=headers, body=value.encode("utf-8"))

    def token(self) -> str:
        """The default service account's access token, cached until a minute before it
        expires (the metadata server hands out the same token until then anyway)."""
        if self._token and self.clock() < self._token_until:
            return self._token
        data = json.loads(self.get("instance/service-accounts/default/token"))
        self._token = str(data["access_token"])
        self._token_until = self.clock() + max(0.0, float(data.get("expires_in", 0)) - 60.0)
        return self._token


@dataclass(frozen=True)
class Identity:
    project: str
    zone: str
    node_name: str
    email: str


def delete_targets(config: Config, identity: Identity) -> list[str]:
    """The DELETE paths (relative to the API root) for this VM; ValueError if the config
    names anything that is not this node or its like-named queued resource."""
    if config.provider == COMPUTE:
        instance = (
            f"compute/v1/projects/{identity.project}/zones/{identity.zone}/instances/"
            f"{identity.node_name}"
        )
        paths = list(config.delete_paths) or [instance]
        if paths != [instance]:
            raise ValueError(f"refusing to delete {paths!r}: not this VM's own instance")
        return paths
    parent = f"v2/projects/{identity.project}/locations/{identity.zone}/"
    node = f"{parent}nodes/{identity.node_name}"
    paths = list(config.delete_paths) or [node]
    for path in paths:
        where, _, query = path.partition("?")
        ours = where in (node, f"{parent}queuedResources/{identity.node_name}")
        if not ours or query not in ("", "force=true"):
            raise ValueError(
                f"refusing to delete {path!r}: not this VM's node or its queued resource"
            )
    return paths


def identity_of(metadata: Metadata, config: Config) -> Identity:
    """Who this VM is, from the metadata server; ValueError if it is not the node the
    config was made for (the watchdog never deletes another node)."""
    if config.provider == COMPUTE:
        env = {"NODE_ID": metadata.get("instance/name")}  # an instance has no tpu-env
    else:
        env = parse_tpu_env(metadata.get("instance/attributes/tpu-env"))
    node = env.get("NODE_ID", "")
    zone = env.get("ZONE", "")
    project = env.get("CONSUMER_PROJECT_ID", "")
    if not zone:
        zone = metadata.get("instance/zone").rsplit("/", 1)[-1]  # projects/NUMBER/zones/Z
    if not project:
        project = metadata.get("project/project-id")
    try:
        email = metadata.get("instance/service-accounts/default/email")
    except HttpError:
        email = "the VM's service account"
    found = (project, zone, node)
    wanted = (config.project, config.zone, config.node_name)
    if found != wanted:
        raise ValueError(
            f"the metadata server says this VM is {'/'.join(found)}, "
            f"but this watchdog was made for {'/'.join(wanted)}"
        )
    return Identity(project, zone, node, email)


class Watchdog:
    """The lease/deadline state machine and the calls it makes."""

    def __init__(
        self,
        config: Config,
        metadata: Metadata,
        *,
        api_base: str,
        resource_manager_base: str,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        log: Callable[[str], None] = print,
        wall: Callable[[], float] = time.time,
        since_first_boot: float = 0.0,
    ) -> None:
        self.config = config
        self.wall = wall
        self.metadata = metadata
        self.api_base = _root(api_base)
        self.rm_base = _root(resource_manager_base)
        self.clock = clock
        self.sleep = sleep
        self.log = log
        now = clock()
        # The grace and the deadline run from the run's first boot (since_first_boot
        # seconds ago: 0 at the first boot, see remember_first_boot), so a reboot that runs
        # the startup-script again restarts neither.
        self.started = now - max(0.0, since_first_boot)
        self.lease_until = self.started + config.boot_grace_seconds
        if since_first_boot > 0:
            # A reboot cut the controller's SSH session (and may have cleared the lease
            # file in /tmp): one lease from now lets a live controller renew before this
            # fires; a gone one costs one lease more, and the deadline still stands.
            self.lease_until = max(self.lease_until, now + config.lease_seconds)
        self.deadline = self.started + config.max_duration_seconds
        self.renewals = 0
        self._lease_text: str | None = None
        self._published = ""
        # The lease to publish (wall clock only for others to read; the decisions above
        # stay monotonic), and whether it still has to go out.
        self.renewed_at = wall()
        self.lease_for = max(self.lease_until - now, 0.001)
        self._lease_unpublished = True
        self._preempted_published = False

    # -- state -------------------------------------------------------------------------

    def publish(self, state: str) -> None:
        """Tell the controller (through the TPU API's getGuestAttributes) how things are."""
        state = state[:MAX_STATE_CHARS]
        if state == self._published:
            return
        self.log(f"state: {state}")
        try:
            self.metadata.put_guest_attribute(STATE_NAMESPACE, STATE_KEY, state)
        except HttpError as error:
            self.log(f"could not publish the state: {error}")
            return
        self._published = state

    def publish_lease(self) -> None:
        """Publish the lease if it changed since the last publication; a failure is
        logged and retried at the next poll (the lease decides nothing here)."""
        if not self._lease_unpublished:
            return
        value = json.dumps(
            {
                "renewed_at": round(self.renewed_at, 3),
                # A difference of two monotonic readings: (now + 45) - now may be
                # 45.0000000000009; the millisecond is as precise as the time above.
                "lease_seconds": round(self.lease_for, 3),
                "renewals": self.renewals,
            },
            sort_keys=True,
        )
        try:
            self.metadata.put_guest_attribute(STATE_NAMESPACE, LEASE_KEY, value)
        except HttpError as error:
            self.log(f"could not publish the lease: {error}")
            return
        self._lease_unpublished = False

    def watch_preemption(self) -> None:
        """Pass `instance/preempted` on as tpulab/preempted = TRUE, once: the laptop reads
        it to recover on another node. Nothing is deleted for it (GCE stops the VM
        anyway). A failed read or PUT is tried again at the next poll, silently: the
        local metadata server answers in microseconds, and a log line per poll would
        drown the log."""
        if self._preempted_published:
            return
        try:
            if self.metadata.get("instance/preempted").upper() != PREEMPTED:
                return
            self.metadata.put_guest_attribute(STATE_NAMESPACE, PREEMPTED_KEY, PREEMPTED)
        except HttpError:
            return
        self._preempted_published = True
        self.log("preempted: this spot VM is being stopped; published tpulab/preempted")

    def arm(self, identity: Identity) -> str:
        """Check the delete permission; publish and return the state."""
        url = f"{self.rm_base}v1/projects/{identity.project}:testIamPermissions"
        wanted = self.config.delete_permission
        body = json.dumps({"permissions": self.config.permissions}).encode("utf-8")
        try:
            headers = self._auth({"Content-Type": "application/json"})
            answer = json.loads(request("POST", url, headers=headers, body=body) or b"{}")
        except HttpError as error:
            state = (
                f"{UNVERIFIED}the permission check (Resource Manager testIamPermissions) "
                f"was refused ({error}); {identity.email} may still be able to delete"
            )
        except (ValueError, KeyError) as error:
            state = f"{UNVERIFIED}the permission check answered nonsense ({error})"
        else:
            granted = answer.get("permissions") or []
            role = "roles/compute.instanceAdmin.v1" if wanted != DELETE_PERMISSION else ""
            lacking = ", ".join(p for p in self.config.permissions if p not in granted)
            if not lacking:
                state = ARMED
            else:
                state = (
                    f"{NO_PERMISSION}{identity.email} lacks {lacking} on project "
                    f"{identity.project}; grant it {role or 'roles/tpu.admin'} (or a role "
                    f"with {lacking})"
                )
        self.publish(state)
        return state

    def _auth(self, headers: dict[str, str]) -> dict[str, str]:
        try:
            token = self.metadata.token()
        except (ValueError, KeyError) as error:
            raise HttpError(0, f"the metadata server's token is unreadable ({error})") from None
        return {**headers, "Authorization": f"Bearer {token}"}

    # -- the lease ---------------------------------------------------------------------

    def observe_lease(self) -> None:
        """A changed lease file is a renewal, dated now (this machine's monotonic clock)."""
        try:
            with open(self.config.lease_path, encoding="utf-8", errors="replace") as handle:
                text = handle.read(4096)
        except OSError:
            return  # not written yet (boot grace), or being replaced right now
        if text == self._lease_text or not text.strip():
            return
        self._lease_text = text
        seconds = self.config.lease_seconds
        try:
            asked = float(json.loads(text.strip().splitlines()[-1]).get("lease_seconds"))
            if 0 < asked < 10**7:
                seconds = asked
        except (ValueError, TypeError, AttributeError, IndexError):
            pass  # a renewal all the same; the configured lease applies
        self.renewals += 1
        self.lease_until = self.clock() + seconds
        self.renewed_at = self.wall()
        self.lease_for = seconds
        self._lease_unpublished = True

    def why_fire(self) -> str | None:
        now = self.clock()
        if now >= self.deadline:
            return DEADLINE
        if now >= self.lease_until:
            return LEASE_EXPIRED
        return None

    # -- deleting ----------------------------------------------------------------------

    def delete_node(self, identity: Identity) -> bool:
        """One DELETE of each target (the queued resource, the node); True when every
        one is accepted or already gone. A refused one does not stop the next."""
        done = True
        for path in delete_targets(self.config, identity):
            done = self._delete(path) and done
        return done

    def _delete(self, path: str) -> bool:
        try:
            request("DELETE", self.api_base + path, headers=self._auth({}))
        except HttpError as error:
            if error.status == 404:
                self.log(f"{path} is already gone")
                return True
            self.log(f"DELETE {path} failed: {error}")
            if not error.transient:
                self.publish(f"{ERROR}delete refused ({error})")
            return False
        self.log(f"DELETE {path} accepted")
        return True

    def fire(self, identity: Identity, reason: str) -> None:
        """Delete this node, retrying until the API took it (the VM then goes away, and
        this process with it)."""
        self.publish(FIRING + reason)
        delay = 1.0
        while True:
            if self.delete_node(identity):
                # Accepted: the node is being deleted. Should it survive (a failed delete
                # operation), send it again later.
                self.log(f"deleting: under way, or done; sent again in {DELETE_AGAIN_SECONDS:g}s")
                self.sleep(DELETE_AGAIN_SECONDS)
                continue
            self.sleep(delay)
            delay = min(delay * 2, 30.0)

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        identity: Identity | None = None
        while identity is None:
            try:
                identity = identity_of(self.metadata, self.config)
            except HttpError as error:
                self.log(f"metadata server: {error}; retrying")
                if not error.transient:
                    self.publish(f"{ERROR}the metadata server refused ({error})")
            except ValueError as error:
                self.publish(f"{ERROR}{error}")
                return  # not our node: never delete anything
            else:
                break
            if self.why_fire() is not None:
                self.publish(f"{ERROR}cannot learn this VM's identity; cannot delete it")
            self.sleep(self.config.poll_seconds)
        try:
            delete_targets(self.config, identity)
        except ValueError as error:
            self.publish(f"{ERROR}{error}")
            return  # never delete anything not this VM's own
        self.arm(identity)
        while True:
            self.watch_preemption()
            self.observe_lease()
            reason = self.why_fire()
            if reason is None:
                self.publish_lease()
            if reason is not None:
                self.log(f"firing: {reason} ({self.renewals} renewal(s) seen)")
                self.fire(identity, reason)
                return
            self.sleep(self.config.poll_seconds)


def daemonize(log_path: str, pid_path: str) -> None:
    """Detach: double fork, a new session, stdio away from the boot runner's pipe (which
    it reads to EOF before the boot continues)."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    with open(pid_path, "w", encoding="utf-8") as handle:
        handle.write(f"{os.getpid()}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="tpulab's self-deleting TPU VM watchdog")
    parser.add_argument("--config", required=True, help="the run's watchdog config (JSON)")
    parser.add_argument("--foreground", action="store_true", help="do not daemonise")
    args = parser.parse_args(argv)
    config = Config.from_json(args.config).on_this_vm(os.environ.get(TMP_ENV))
    if not args.foreground:
        daemonize(config.log_path, config.pid_path)

    def log(message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"{stamp} tpulab-watchdog[{config.run_id}]: {message}", flush=True)

    env = os.environ
    # A config without api_base (an embedded emulator's run, whose controller cannot name
    # the emulator's root to the VM) takes the environment's, else the provider's Google root.
    google_base = COMPUTE_API_BASE if config.provider == COMPUTE else TPU_API_BASE
    wall = vm_wall_clock(env.get(CLOCK_SKIP_ENV))
    now = wall()
    first_boot = remember_first_boot(first_boot_path(config.run_id, env.get(DISK_ENV)), now, log)
    watchdog = Watchdog(
        config,
        Metadata(env.get(METADATA_HOST_ENV) or METADATA_HOST),
        api_base=config.api_base or env.get(TPU_API_BASE_ENV) or google_base,
        resource_manager_base=env.get(RESOURCE_MANAGER_BASE_ENV) or RESOURCE_MANAGER_BASE,
        clock=vm_clock(env.get(CLOCK_SKIP_ENV)),
        log=log,
        since_first_boot=max(0.0, now - first_boot),
    )
    log(
        f"started for node {config.node_name} in {config.zone}: lease {config.lease_seconds:g}s "
        f"(boot grace {config.boot_grace_seconds:g}s), deadline {config.max_duration_seconds:g}s"
        f", first boot {now - first_boot:.0f}s ago"
    )
    while True:
        try:
            watchdog.run()
            return 0
        except Exception as error:  # a bug must not disarm it: say so, then go on guarding
            watchdog.publish(f"{ERROR}the watchdog failed: {type(error).__name__}: {error}")
            log(f"failed: {type(error).__name__}: {error}; starting over")
            time.sleep(config.poll_seconds)


if __name__ == "__main__":
    sys.exit(main())
