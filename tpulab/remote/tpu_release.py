"""Free a TPU that a stale process still holds, before a run's command starts on it.

libtpu lets one process own a VM's chips; a process left from an earlier step (a slice
worker's verifier whose peers failed, a killed run's orphan) makes the next JAX program
fail with "TPU is already in use" (jax #10192). MaxText's multihost_runner clears it
before every launch: it kills the holders of /dev/accel* (v4, v5e) and /dev/vfio/* (v5p,
v6e) and removes /tmp/libtpu_lockfile. `release_command` does the same on a node tpulab
created for this run (never on a session's node, where a holder may be the user's own
work: `tpulab exec` refuses a busy node instead). It finds holders through /proc with
`find -lname` (findutils is Essential on the Debian and Ubuntu images; the image's `lsof`
is not guaranteed), kills only what this login may kill (no sudo), waits
for them to go, and reports what it did in one line that `parse_release_report` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LIBTPU_LOCKFILE",
    "RELEASE_MARKER",
    "TPU_DEVICE_GLOBS",
    "TpuRelease",
    "parse_release_report",
    "release_command",
]

TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/*")
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
RELEASE_MARKER = "TPULAB_TPU_RELEASE "

# $1: the lock file; $2: seconds to wait for the killed to go; the rest: device globs,
# matched (find's -lname: shell patterns, `*` crossing `/` as in `case`) against every
# open file of every process. One `find` per glob, not a `readlink` per descriptor: a
# process per descriptor cost 1.3 CPU-seconds per 1,000 descriptors here (fork and exec
# each), and a busy machine has thousands. A process that ends meanwhile is skipped.
_RELEASE_SCRIPT = r"""
lock=$1; wait_for=$2; shift 2
holders=""
for pattern in "$@"; do
  for fd in $(find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 -lname "$pattern" 2>/dev/null); do
    pid=${fd#/proc/}; pid=${pid%%/*}
    [ "$pid" = "$$" ] || holders="$holders $pid"
  done
done
killed=""; refused=""
for pid in $(printf '%s\n' $holders | sort -un); do
  if kill -9 "$pid" 2>/dev/null; then killed="$killed,$pid"; else refused="$refused,$pid"; fi
done
# Gone: no process, or a zombie (dead, its files closed) that its parent has not
# reaped yet -- which a parent that does not reap leaves standing for good.
gone() {
  state=$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$1/stat" 2>/dev/null) || return 0
  [ -z "$state" ] || [ "$state" = Z ] || [ "$state" = X ]
}
waited=0
for pid in $(printf '%s' "$killed" | tr ',' ' '); do
  while ! gone "$pid" && [ "$waited" -lt "$((wait_for * 10))" ]; do
    sleep 0.1; waited=$((waited + 1))
  done
done
removed=no
if [ -e "$lock" ] && [ -z "$refused" ]; then rm -f "$lock" && removed=yes; fi
echo "TPULAB_TPU_RELEASE killed=${killed#,} refused=${refused#,} lockfile=$removed"
"""


def release_command(
    *,
    device_globs: Sequence[str] = TPU_DEVICE_GLOBS,
    lockfile: str = LIBTPU_LOCKFILE,
    wait_seconds: int = 10,
) -> list[str]:
    """argv that frees the TPU (see the module's docstring); the globs and the lock file
    are arguments so a test can point them at files it holds."""
    return ["sh", "-c", _RELEASE_SCRIPT, "sh", lockfile, str(wait_seconds), *device_globs]


@dataclass(frozen=True)
class TpuRelease:
    """What `release_command` did: the pids it killed, those it could not, and whether it
    removed libtpu's lock file."""

    killed: tuple[int, ...]
    refused: tuple[int, ...]
    removed_lockfile: bool

    @property
    def anything(self) -> bool:
        return bool(self.killed or self.refused or self.removed_lockfile)

    def describe(self) -> str:
        said = []
        if self.killed:
            said.append("killed pid " + ", ".join(map(str, self.killed)))
        if self.refused:
            said.append("could not kill pid " + ", ".join(map(str, self.refused)))
        if self.removed_lockfile:
            said.append(f"removed {LIBTPU_LOCKFILE}")
        return "; ".join(said) or "nothing held the TPU"


def parse_release_report(stdout: str) -> TpuRelease:
    """The report line; ValueError when the output has none."""
    line = next((x for x in stdout.splitlines() if x.startswith(RELEASE_MARKER)), None)
    if line is None:
        raise ValueError(f"no {RELEASE_MARKER.strip()} line in {stdout[-200:]!r}")
    fields = dict(part.split("=", 1) for part in line[len(RELEASE_MARKER) :].split())

    def pids(name: str) -> tuple[int, ...]:
        return tuple(int(p) for p in fields.get(name, "").split(",") if p)

    return TpuRelease(pids("killed"), pids("refused"), fields.get("lockfile") == "yes")
