"""The names the controller and the emulator both speak, and nothing else (stdlib only).

The emulator is an island (docs/architecture.md §2): it imports this module, `models`, `catalog`
and `errors`, never the controller's internals. Every string that crosses between the
two sides -- labels, guest-attribute keys, node metadata keys -- is defined once here,
so neither side can drift from the other.
"""

from __future__ import annotations

__all__ = [
    "DELETE_NODE_PERMISSION",
    "DELETE_QUEUED_RESOURCE_PERMISSION",
    "EMULATED_CLOCK_SKIP_ENV",
    "EMULATED_DISK_ENV",
    "EMULATED_IMAGE_ENV",
    "EMULATED_TMP_ENV",
    "EMULATOR_COORDINATOR_PORT_ATTRIBUTE",
    "EMULATOR_SSH_PORT_ATTRIBUTE",
    "EMULATOR_SSH_USER_ATTRIBUTE",
    "GUEST_ATTRIBUTES_METADATA",
    "HOST_KEY_ATTRIBUTE",
    "HOST_KEY_NAMESPACE",
    "HOST_KEY_TYPES",
    "KIND_LABEL",
    "KIND_RUN",
    "KIND_SESSION",
    "LEASE_ATTRIBUTE",
    "MANAGED_BY_LABEL",
    "MANAGED_BY_VALUE",
    "METADATA_DEFAULT_HOST",
    "METADATA_FLAVOR",
    "METADATA_FLAVOR_HEADER",
    "METADATA_HOST_ENV",
    "METADATA_IP_ENV",
    "METADATA_ROOT_PATH",
    "OS_LOGIN_METADATA",
    "OWNER_LABEL",
    "PREEMPTED_ATTRIBUTE",
    "RESOURCE_MANAGER_BASE_ENV",
    "RESOURCE_MANAGER_DEFAULT_BASE",
    "RUN_ID_LABEL",
    "SSH_KEYS_METADATA",
    "STARTUP_SCRIPT_METADATA",
    "TPU_API_BASE_ENV",
    "TPU_API_DEFAULT_BASE",
    "TPU_ENV_ATTRIBUTE",
    "WATCHDOG_STATE_ATTRIBUTE",
]

# Labels every node tpulab creates carries; teardown finds nodes by them.
MANAGED_BY_LABEL = "managed-by"
MANAGED_BY_VALUE = "tpulab"
RUN_ID_LABEL = "tpulab-run"
# What the node is for (a run deletes it at its end; a session keeps it for `tpulab up`)
# and which tpulab home made it (`tpulab.paths.owner_id`): with the watchdog's lease
# below, they let `teardown --verify` on another machine tell live work from leftovers.
KIND_LABEL = "tpulab-kind"
KIND_RUN = "run"
KIND_SESSION = "session"
OWNER_LABEL = "tpulab-owner"

# Node metadata key whose lines `user:ssh-ed25519 KEY user` the guest agent installs.
SSH_KEYS_METADATA = "ssh-keys"
# With OS Login on (project metadata enable-oslogin=TRUE, common in organisations) the
# guest agent ignores ssh-keys; instance metadata "FALSE" overrides the project's value
# unless an organisation policy enforces OS Login.
OS_LOGIN_METADATA = "enable-oslogin"
# Guest attributes are how the VM publishes its SSH host keys to the API.
GUEST_ATTRIBUTES_METADATA = "enable-guest-attributes"

# The guest agent publishes the VM's SSH host keys under this namespace, one key per type.
HOST_KEY_NAMESPACE = "hostkeys"
HOST_KEY_ATTRIBUTE = f"{HOST_KEY_NAMESPACE}/ssh-ed25519"
# The types the GCE guest agent publishes (its host_key_types = ecdsa,ed25519,rsa), in
# the order the controller prefers to pin them.
HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa")

# Published only by the emulator: the loopback port of a node's SSH server (a real VM
# listens on 22), and the account an emulated OpenSSH host can log in (it cannot create
# users). The controller honours the user attribute for emulated runs only.
EMULATOR_SSH_PORT_ATTRIBUTE = "tpulab-emulator/ssh-port"
EMULATOR_SSH_USER_ATTRIBUTE = "tpulab-emulator/ssh-user"
# Published only by the emulator, on every worker of a multi-host node: the loopback port
# JAX's coordinator is to use on worker 0 (`--coordinator <worker 0 ipAddress>:<port>`).
# Online it is JAX's fixed 8476 (jax/_src/clusters/cloud_tpu_cluster.py); the emulated
# workers share one machine, where a fixed port would collide between nodes.
EMULATOR_COORDINATOR_PORT_ATTRIBUTE = "tpulab-emulator/coordinator-port"

# Set only by the emulator in every session's environment: which image a node booted
# ("bare ..." like a real TPU VM image, or "preloaded ..."), so a run can say which it had.
EMULATED_IMAGE_ENV = "TPULAB_EMULATED_IMAGE"

# -- the VM's own identity (docs/architecture.md §7, §10): what code ON the node uses ------

# Node metadata key whose value the guest agent's google_metadata_script_runner writes to
# a file and runs at every boot (as root on a real VM; in the node's sandbox here).
STARTUP_SCRIPT_METADATA = "startup-script"

# The metadata server. A real VM reaches it at metadata.google.internal (169.254.169.254);
# google-auth honours GCE_METADATA_HOST (host[:port]) and GCE_METADATA_IP (ip[:port],
# also what JAX's cloud_tpu_cluster reads), so node code that resolves its address as
# google-auth does runs unchanged against the emulator, which sets both to 127.0.0.1:PORT.
METADATA_HOST_ENV = "GCE_METADATA_HOST"
METADATA_IP_ENV = "GCE_METADATA_IP"
METADATA_DEFAULT_HOST = "metadata.google.internal"
METADATA_ROOT_PATH = "/computeMetadata/v1/"
# Required on every request (the server answers 403 without it) and sent on every answer.
METADATA_FLAVOR_HEADER = "Metadata-Flavor"
METADATA_FLAVOR = "Google"
# Instance attribute the TPU service sets: `KEY: 'value'` lines (NODE_ID, WORKER_ID,
# ZONE, CONSUMER_PROJECT_ID, ...), the node's own name, zone and project.
TPU_ENV_ATTRIBUTE = "tpu-env"

# API bases as seen from the node: unset on a real VM (the defaults); the emulator sets
# them in every node process's environment so the same code reaches the emulated API.
# Both end in "/"; paths are appended without a leading "/" (e.g. "v2/projects/...").
TPU_API_BASE_ENV = "TPULAB_TPU_API_BASE"
TPU_API_DEFAULT_BASE = "https://tpu.googleapis.com/"
RESOURCE_MANAGER_BASE_ENV = "TPULAB_RESOURCE_MANAGER_BASE"
RESOURCE_MANAGER_DEFAULT_BASE = "https://cloudresourcemanager.googleapis.com/"
# Only the emulator sets it, in every node process's environment: a file holding how many
# seconds the emulated VM's clock has been moved forward (`Emulator.skip_vm_clock`), which
# the watchdog adds to its monotonic clock, so a test reaches a --ttl deadline without
# waiting minutes for it. Unset on a real VM.
EMULATED_CLOCK_SKIP_ENV = "TPULAB_EMULATED_CLOCK_SKIP"
# Only the emulator sets it, in every node process's environment: the directory that is
# this worker's /tmp. Each real worker VM of a slice has its own /tmp, where its watchdog
# reads the lease the controller renews on it; the emulated workers share this machine's,
# so the watchdog and the renew script put their /tmp files here instead. Unset on a real
# VM (the files stay in /tmp). Not TMPDIR: a user's shell profile may set that for one
# user and not for root, and the lease is written by one and read by the other.
EMULATED_TMP_ENV = "TPULAB_EMULATED_TMP"
# Only the emulator sets it, in every node process's environment: the directory standing
# in for the VM's root disk (each emulated VM's own, kept across its reboots), under which
# the watchdog remembers the run's first boot (var/lib/tpulab/first-boot-RUN). Unset on a
# real VM: the watchdog writes /var/lib/tpulab itself, as root.
EMULATED_DISK_ENV = "TPULAB_EMULATED_DISK"
# What the node's identity needs to delete its own node (roles/tpu.admin grants it);
# asked of Resource Manager v1 `projects/{p}:testIamPermissions`.
DELETE_NODE_PERMISSION = "tpu.nodes.delete"
# ... and, for a node a queued resource made, to delete that queued resource first (IAM
# spells the resource type all lower case; roles/tpu.admin grants it too).
DELETE_QUEUED_RESOURCE_PERMISSION = "tpu.queuedresources.delete"
# Where the VM's watchdog (remote_payloads/watchdog.py) publishes how it is, as
# getGuestAttributes keys it (namespace/key): "armed", "unverified: ...",
# "no-permission: ...", "error: ...", "firing: ...".
WATCHDOG_STATE_ATTRIBUTE = "tpulab/watchdog"
# Where the watchdog publishes its lease: JSON {"renewed_at": EPOCH, "lease_seconds": S,
# "renewals": N}, the VM's wall clock at the last renewal it saw (its start before the
# first, the boot grace standing in for the lease). Fresh means the node is still
# someone's live work; stale means its watchdog should have deleted it.
LEASE_ATTRIBUTE = "tpulab/lease"
# Where the VM's watchdog publishes "TRUE" once its metadata server's `instance/preempted`
# says TRUE: the VM knows it is being reclaimed before the API's node state does (that
# can lag by about a minute), so a failed spot run reads it first (tpulab.run.symptoms).
# The watchdog deletes nothing for it.
PREEMPTED_ATTRIBUTE = "tpulab/preempted"
