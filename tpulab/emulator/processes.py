"""The processes of an emulated node: tagged, held, and killed together, as a VM's are.

- `NODE_TAG_VAR` / `held` / `kill_tagged`: every session process carries the node's tag
  in its environment and runs under a holder (`holder.py`, a child subreaper), so
  deleting a node kills everything it started, the way deleting a VM does: daemonised
  children included, even those that dropped the tag with `env -i` and left their
  session with `setsid`, found by ancestry (Linux /proc; elsewhere only live sessions die).
- `reserve_port` / `common_free_port`: a loopback port held (bound, not listening) so it
  can be published before the server accepts connections; one port free on every
  worker's address of a slice.

Both SSH host backends (embedded and OpenSSH) use these.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tpulab.emulator.guest_init import process_table, tagged

__all__ = [
    "HOLDER",
    "NODE_TAG_VAR",
    "common_free_port",
    "held",
    "kill_tagged",
    "new_node_tag",
    "reserve_port",
]

NODE_TAG_VAR = "TPULAB_EMULATED_NODE"


def reserve_port(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """Bind (but do not listen on) a free port (or `port`; OSError when it is taken):
    connections to it are refused, yet no other process can take it before our server
    starts listening there."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    os.set_inheritable(sock.fileno(), False)
    return sock


def common_free_port(addresses: Sequence[str], attempts: int = 50) -> int:
    """A port free on every one of `addresses` at once (a slice's workers listen on
    127.0.0.(1+w), all on one port). Probed, then released: the caller binds it again,
    and starts the whole set again on another port should it be taken meanwhile."""
    for _ in range(attempts):
        held_socks = [reserve_port(addresses[0])]
        port = held_socks[0].getsockname()[1]
        try:
            for address in addresses[1:]:
                held_socks.append(reserve_port(address, port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise  # e.g. EADDRNOTAVAIL: no such loopback address on this machine
            continue  # taken on some address: another port
        else:
            return int(port)
        finally:
            for sock in held_socks:
                sock.close()
    raise OSError(f"no port is free on all of {', '.join(addresses)}")


def new_node_tag(node_key: str) -> str:
    return f"{node_key}.{secrets.token_hex(8)}"


HOLDER = Path(__file__).with_name("holder.py")


def held(argv: Sequence[str], *, status_fd: int | None = None) -> list[str]:
    """`argv` run under `holder.py`, the child subreaper that keeps whatever it leaves
    running in a process tree `kill_tagged` can find (see holder.py)."""
    status = ["--status-fd", str(status_fd)] if status_fd is not None else []
    return [sys.executable, "-I", "-S", str(HOLDER), *status, "--", *argv]


def _below(table: Mapping[int, tuple[int, str]], heads: set[int]) -> set[int]:
    """The live descendants of `heads` (not the heads themselves)."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = list(heads)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child not in heads:
                found.add(child)
                todo.append(child)
    return {pid for pid in found if table[pid][1] not in ("Z", "X")}


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


_KILL_ROUNDS = 200


def kill_tagged(tag: str, *, roots: Iterable[int] = ()) -> int:
    """SIGKILL everything a node runs, the way deleting a VM does: the processes whose
    environment carries `NODE_TAG_VAR=tag`, the `roots` (its holders, see `held`), and
    every descendant of either -- which is what `env -i`, `setsid` or a double fork
    cannot leave, because the holders are child subreapers. The heads are stopped first
    (a stopped process forks nothing), their descendants killed until none is left
    (what one of them orphans meanwhile is adopted by a holder, and found next round),
    then the heads. Linux /proc; elsewhere nothing is found. Returns how many died."""
    me = os.getpid()
    needle = f"{NODE_TAG_VAR}={tag}".encode()
    table = process_table()
    heads = {pid for pid in roots if pid in table and pid != me}
    heads |= {pid for pid in table if pid != me and tagged(pid, needle)}
    for pid in heads:
        _signal(pid, signal.SIGSTOP)
    killed: set[int] = set()
    for _ in range(_KILL_ROUNDS):
        victims = _below(process_table(), heads) - {me}
        if not victims:
            break
        for pid in victims:
            _signal(pid, signal.SIGKILL)
        killed |= victims
        time.sleep(0.01)  # let them turn into zombies before the next look
    for pid in heads:
        _signal(pid, signal.SIGKILL)
    return len(killed | heads)
