"""The names the controller and the emulator both speak, and nothing else (stdlib only).

The emulator is an island (DESIGN.md §2): it imports this module, `models`, `catalog`
and `errors`, never the controller's internals. Every string that crosses between the
two sides -- labels, guest-attribute keys, node metadata keys -- is defined once here,
so neither side can drift from the other.
"""

from __future__ import annotations

__all__ = [
    "EMULATED_IMAGE_ENV",
    "EMULATOR_SSH_PORT_ATTRIBUTE",
    "EMULATOR_SSH_USER_ATTRIBUTE",
    "GUEST_ATTRIBUTES_METADATA",
    "HOST_KEY_ATTRIBUTE",
    "HOST_KEY_NAMESPACE",
    "HOST_KEY_TYPES",
    "MANAGED_BY_LABEL",
    "MANAGED_BY_VALUE",
    "OS_LOGIN_METADATA",
    "RUN_ID_LABEL",
    "SSH_KEYS_METADATA",
]

# Labels every node tpulab creates carries; teardown finds nodes by them.
MANAGED_BY_LABEL = "managed-by"
MANAGED_BY_VALUE = "tpulab"
RUN_ID_LABEL = "tpulab-run"

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

# Set only by the emulator in every session's environment: which image a node booted
# ("bare ..." like a real TPU VM image, or "preloaded ..."), so a run can say which it had.
EMULATED_IMAGE_ENV = "TPULAB_EMULATED_IMAGE"
