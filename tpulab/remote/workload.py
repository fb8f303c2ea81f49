"""How the user's command (`tpulab run ... -- CMD`) is started, stopped and read back on
the VM. Pure builders: argv lists (quoted by tpulab.remote.cmdline when sent), no paramiko.

The command is never pasted into a shell: its argv goes, element by element, after `--`
to the staged launcher (remote_payloads/workload_launcher.py), which runs it in the
synced workspace, in its own session, with the venv first on PATH, copying its combined
output to the SSH stream and to a log on the VM, and reports one `TPULAB_WORKLOAD {json}`
line. Paths are relative to the login directory, like the bootstrap's.

    ~/jax-tpu-lab/workspace/         the synced --workdir (the command's cwd)
    ~/jax-tpu-lab/run/out/           TPULAB_RUN_DIR: whatever is in it comes back
    ~/jax-tpu-lab/run/output.log     the command's combined output (comes back too)
    ~/jax-tpu-lab/run/command.pid    its process group, for a stop from another session
    ~/jax-tpu-lab/run/status.json    what the launcher reported (while it runs: its argv
                                     and start time, for the busy check of a later exec)
    ~/jax-tpu-lab/exec.lock          the exec lock (remote_payloads/exec_lock.py): flocked
                                     by the exec that holds it, for as long as its SSH
                                     connection lives; inside, who that is
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tpulab import paths
from tpulab.config.sessions import MAX_TTL_SECONDS
from tpulab.errors import ConfigError
from tpulab.remote.bootstrap import LAB_DIR, VENV_DIR, VENV_PYTHON
from tpulab.remote.cmdline import remote_command
from tpulab.remote.payload import payload_env

__all__ = [
    "BUSY_MARKER",
    "IDLE_REPORT",
    "LAUNCHER_NAME",
    "LAUNCHER_SETTLE_SECONDS",
    "LOCKED_REPORT",
    "LOCK_HOLD_SECONDS",
    "LOCK_MARKER",
    "LOCK_PATH",
    "LOG_PATH",
    "MAX_COMMAND_LINE_BYTES",
    "RUN_DIR",
    "STAGED_LAUNCHER",
    "STOP_GRACE_SECONDS",
    "WORKLOAD_MARKER",
    "WORKSPACE_DIR",
    "BusyCommand",
    "HeldAnswer",
    "HoldingShell",
    "LaunchReport",
    "LockHolder",
    "busy_command",
    "checked_launch_line",
    "follow_command",
    "follow_failure",
    "launch_command",
    "lock_command",
    "parse_busy_report",
    "parse_launch_report",
    "parse_lock_report",
    "stop_command",
    "workload_env",
]

LAUNCHER_NAME = "workload_launcher.py"
STAGED_LAUNCHER = f"{LAB_DIR}/{LAUNCHER_NAME}"
WORKSPACE_DIR = f"{LAB_DIR}/workspace"
_RUN_ROOT = f"{LAB_DIR}/run"
RUN_DIR = f"{_RUN_ROOT}/out"
LOG_PATH = f"{_RUN_ROOT}/output.log"
PID_FILE = f"{_RUN_ROOT}/command.pid"
STATUS_PATH = f"{_RUN_ROOT}/status.json"
WORKLOAD_MARKER = "TPULAB_WORKLOAD "
# Seconds between SIGTERM and SIGKILL for a stopped or timed-out command: enough for a
# training loop to write its last checkpoint, short enough not to bill for long.
STOP_GRACE_SECONDS = 10.0
# The SSH wrapper's own limit past the launcher's: a backstop only (the launcher times
# the command out itself, so it can report it).
LAUNCH_SLACK_SECONDS = STOP_GRACE_SECONDS + 30.0

# Kill the command's process group from a second session: SIGTERM, up to `grace`
# seconds for it to go, then SIGKILL. Says which happened. `kill -s SIG --` because
# dash (Debian's and Ubuntu's sh) rejects `kill -SIG -- -PGID` ("Illegal number").
# Then up to `settle` seconds for the launcher to finish: it copies the last of the
# command's output into the log and only then replaces its "running" status, so the
# fetch that follows a stop gets the whole log (without this wait, a loaded VM could
# be fetched from before the launcher had written the last lines).
_STOP_SCRIPT = r"""
pid_file=$1; grace=$2; status=$3; settle=$4
pid=$(cat "$pid_file" 2>/dev/null) || { echo "TPULAB_STOP not started"; exit 0; }
if kill -s TERM -- "-$pid" 2>/dev/null; then
  ticks=$((grace * 5))
  while [ "$ticks" -gt 0 ] && kill -s 0 -- "-$pid" 2>/dev/null; do
    sleep 0.2; ticks=$((ticks - 1))
  done
  if kill -s KILL -- "-$pid" 2>/dev/null; then said=killed; else said=terminated; fi
else
  said="already ended"
fi
ticks=$((settle * 5))
while [ "$ticks" -gt 0 ] && grep -q '"running": true' "$status" 2>/dev/null; do
  sleep 0.2; ticks=$((ticks - 1))
done
echo "TPULAB_STOP $said"
"""
# The launcher waits 5 s for a grandchild that holds the output pipe, then writes its
# status: this is how long a stop waits for that.
LAUNCHER_SETTLE_SECONDS = 10

# Is a command an earlier exec started still running? Its process group alive (a stale
# pid file of a dead group is not), then what the launcher says it runs. Reads only.
# `kill -s 0 --`, as in the stop script above.
_BUSY_SCRIPT = r"""
pid=$(cat "$1" 2>/dev/null) || pid=
case $pid in ''|*[!0-9]*) echo "TPULAB_BUSY none"; exit 0;; esac
if kill -s 0 -- "-$pid" 2>/dev/null; then echo "TPULAB_BUSY $pid"; cat "$2" 2>/dev/null
else echo "TPULAB_BUSY none"; fi
"""
BUSY_MARKER = "TPULAB_BUSY "
# What the check prints on a VM where nothing runs (a dry run's planned answer).
IDLE_REPORT = BUSY_MARKER + "none\n"


def workload_env(
    platform: str,
    devices: int,
    run_id: str,
    extra: Iterable[tuple[str, str]] = (),
    *,
    worker: int = 0,
    workers: int = 1,
    coordinator: str | None = None,
) -> dict[str, str]:
    """What the command's environment gets: the platform the verifier proved, named
    twice as the course expects (JAX_PLATFORMS, COURSE_EXPECT_PLATFORM), the device
    count flag on an emulated (CPU) node exactly as the payload had it, the run id and
    the user's --env; on a slice, which worker this is of how many (TPULAB_WORKER_ID,
    TPULAB_NUM_WORKERS: `jax.distributed.initialize(num_processes=, process_id=)` where
    JAX cannot find them itself) and worker 0's `coordinator` address as
    JAX_COORDINATOR_ADDRESS, which `jax.distributed.initialize` reads when given none
    (jax/_src/distributed.py). On a CPU (emulated) slice, cross-process collectives
    need gloo (JAX_CPU_COLLECTIVES_IMPLEMENTATION, jax's cpu_collectives_implementation
    flag): examples/slice_lab/psum.py runs unchanged on both. TPULAB_RUN_DIR is set by
    the launcher (an absolute path there)."""
    env = payload_env(platform, devices)
    env["COURSE_EXPECT_PLATFORM"] = platform
    env["TPULAB_RUN_ID"] = run_id
    if workers > 1:
        env["TPULAB_WORKER_ID"] = str(worker)
        env["TPULAB_NUM_WORKERS"] = str(workers)
        if coordinator is not None:
            env["JAX_COORDINATOR_ADDRESS"] = coordinator
        if platform == "cpu":
            env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
    env.update(extra)
    return env


def launch_command(command: Sequence[str], *, timeout: float) -> list[str]:
    """argv that runs `command` through the staged launcher with the venv's python."""
    return [
        VENV_PYTHON,
        STAGED_LAUNCHER,
        "--workspace",
        WORKSPACE_DIR,
        "--run-dir",
        RUN_DIR,
        "--log",
        LOG_PATH,
        "--pid-file",
        PID_FILE,
        "--status",
        STATUS_PATH,
        "--venv",
        VENV_DIR,
        "--timeout",
        f"{timeout:g}",
        "--grace",
        f"{STOP_GRACE_SECONDS:g}",
        "--",
        *command,
    ]


# How long a follow waits for the launcher's status to name the run: the launcher
# writes it within a second of starting, so a launch not named by then never began.
FOLLOW_WAIT_SECONDS = 10.0
FOLLOW_MARKER = "TPULAB_FOLLOW "


def follow_command(run_id: str) -> list[str]:
    """argv that follows run `run_id`'s launch after its SSH session was lost: the log's
    new bytes on stdout until the launcher's result, reported as the launch would."""
    return [
        VENV_PYTHON,
        STAGED_LAUNCHER,
        "--follow",
        "--status",
        STATUS_PATH,
        "--log",
        LOG_PATH,
        "--run-id",
        run_id,
        "--wait",
        f"{FOLLOW_WAIT_SECONDS:g}",
    ]


FOLLOW_FAILURES = ("not-started", "launcher-died")


def follow_failure(stderr: str) -> str | None:
    """Why a follow could not follow (one of FOLLOW_FAILURES), or None."""
    for line in stderr.splitlines():
        said = line.removeprefix(FOLLOW_MARKER).strip()
        if line.startswith(FOLLOW_MARKER) and said in FOLLOW_FAILURES:
            return said
    return None


# The most bytes the launch's remote command line may have (`remote_command` of the
# launcher's argv with the command's environment as `export`s: exactly what the SSH
# exec request carries). sshd hands that whole string to the login shell as ONE argument
# (`$SHELL -c LINE`), and Linux refuses any single argument over MAX_ARG_STRLEN (32
# pages: 128 KiB, its NUL included) with E2BIG; the shell's exec of the launcher then
# carries the argv and the exported values again, under ARG_MAX for argv and environment
# together (a quarter of the stack limit: 2 MiB by default). The VM fails such a command
# before it starts and the SSH channel just closes, which reads as a dropped connection
# (a preemption?) at run time; so it is refused while validating, before the create.
# 96 KiB leaves 32 KiB of that 128 KiB for quoting changes and for what the VM adds (the
# login environment, sshd's SSH_* variables) and is far below the SSH packet limit
# servers enforce (OpenSSH: 256 KiB).
MAX_COMMAND_LINE_BYTES = 96 * 1024


def checked_launch_line(argv: Sequence[str], *, env: Mapping[str, str], timeout: float) -> str:
    """The exact line `Connection.run(argv, env=env, timeout=timeout)` sends for a
    `launch_command` argv; ConfigError when it is over MAX_COMMAND_LINE_BYTES, naming
    its largest part (an argument of the command after `--`, or an --env value)."""
    line = remote_command(argv, env=env, timeout=timeout)
    size = _bytes(line)
    if size <= MAX_COMMAND_LINE_BYTES:
        return line
    command = list(argv)[list(argv).index("--") + 1 :] if "--" in argv else list(argv)
    parts = [(f"argument {i} of the command", arg) for i, arg in enumerate(command, 1)]
    parts += [(f"the value of {name}", value) for name, value in env.items()]
    what, largest = max(parts, key=lambda part: _bytes(part[1]))
    raise ConfigError(
        f"The command line sent to the VM would be {size:,} bytes (the command after -- "
        f"and the --env values, quoted), over the {MAX_COMMAND_LINE_BYTES:,}-byte (96 KiB) "
        f"limit; the largest part is {what}, {_bytes(largest):,} bytes. Linux refuses "
        "one argument over 128 KiB (E2BIG): the VM could not even start it.",
        hint="Put large inputs in a file in the workspace (--workdir is uploaded) and "
        "pass its path to the command, or have the command read them from there.",
    )


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def stop_command(grace: float = STOP_GRACE_SECONDS) -> list[str]:
    """argv that stops the running command (its whole process group)."""
    return [
        "sh", "-c", _STOP_SCRIPT, "sh", PID_FILE, str(max(1, round(grace))),
        STATUS_PATH, str(LAUNCHER_SETTLE_SECONDS),
    ]  # fmt: skip


def busy_command() -> list[str]:
    """argv that reports whether the last launched command's process group still runs."""
    return ["sh", "-c", _BUSY_SCRIPT, "sh", PID_FILE, STATUS_PATH]


@dataclass(frozen=True)
class BusyCommand:
    """A command still running on the VM: its process group, and -- when the launcher's
    status file says so -- its argv and start time (wall clock on the VM)."""

    pgid: int
    command: list[str] | None
    started_at: float | None


def parse_busy_report(stdout: str) -> BusyCommand | None:
    """None when nothing runs; ValueError when the output is not the check's."""
    lines = stdout.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith(BUSY_MARKER)), None)
    if at is None:
        raise ValueError(f"no {BUSY_MARKER.strip()} line in {stdout[-200:]!r}")
    said = lines[at][len(BUSY_MARKER) :].strip()
    if said == "none":
        return None
    pgid = int(said)
    try:
        status = json.loads("\n".join(lines[at + 1 :]))
    except ValueError:
        status = None  # a launcher older than the status it writes at start
    if not isinstance(status, dict) or status.get("pgid") != pgid:
        return BusyCommand(pgid, None, None)  # the status is another command's (or none)
    command = status.get("command")
    started = status.get("started_at")
    return BusyCommand(
        pgid,
        [str(arg) for arg in command] if isinstance(command, list) else None,
        float(started) if isinstance(started, (int, float)) else None,
    )


@dataclass(frozen=True)
class LaunchReport:
    """What the launcher said about the command (None: it said nothing parseable)."""

    exit_status: int
    started: bool
    timed_out: bool
    stopped: str | None
    seconds: float | None
    # Lines the launcher left out of the stream because the laptop fell behind (all
    # of them are in the log on the VM, which is fetched).
    unstreamed_lines: int = 0


def parse_launch_report(stderr: str) -> LaunchReport | None:
    found: LaunchReport | None = None
    for line in stderr.splitlines():
        if not line.startswith(WORKLOAD_MARKER):
            continue
        try:
            data = json.loads(line[len(WORKLOAD_MARKER) :])
            found = LaunchReport(
                exit_status=int(data["exit_status"]),
                started=bool(data.get("started", True)),
                timed_out=bool(data.get("timed_out", False)),
                stopped=data.get("stopped"),
                seconds=data.get("seconds"),
                unstreamed_lines=int(data.get("unstreamed_lines") or 0),
            )
        except (ValueError, KeyError, TypeError):
            continue
    return found


# -- the exec lock ----------------------------------------------------------------------

LOCK_NAME = "exec_lock.py"
LOCK_PATH = f"{LAB_DIR}/exec.lock"
LOCK_MARKER = "TPULAB_LOCK "
# What the lock script prints when the lock is ours (a dry run's planned answer).
LOCKED_REPORT = LOCK_MARKER + "locked\n"
# The remote `timeout` around the holder: past the longest a session lives (its --ttl
# bound), so only the end of the exec's connection ends it, never the clock.
LOCK_HOLD_SECONDS = MAX_TTL_SECONDS + 3600.0
# The lock script answers at once (or after its 2 s wait for a holder that is letting
# go): seconds, even on a slow VM.
LOCK_ANSWER_SECONDS = 30.0
# The exec writes a heartbeat byte to the lock's holder this often, and the holder lets
# go after LOCK_SILENCE_SECONDS without one: a laptop that lost power or its network
# sends no FIN, and the VM's sshd would keep the session (and the lock) for hours. Six
# missed beats: a live exec on a slow link is never taken for a dead one.
LOCK_BEAT_SECONDS = 10.0
LOCK_SILENCE_SECONDS = 60.0


class HeldAnswer(Protocol):
    """What a held command printed up to its first stdout line; `exit_status` None while
    it still runs (held open until the connection closes)."""

    @property
    def exit_status(self) -> int | None: ...

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...


class HoldingShell(Protocol):
    """`tpulab.remote.ssh.Connection.hold`: start a command that runs, its stdin open, for
    as long as the connection, and return once it has said its first line."""

    def hold(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        answer_within: float,
        beat_every: float | None = None,
    ) -> HeldAnswer: ...


@functools.cache
def _lock_source() -> str:
    """remote_payloads/exec_lock.py, which travels as `python3 -c` (no staging: the lock
    is taken before anything is synced)."""
    return paths.payload_path(LOCK_NAME).read_text(encoding="utf-8")


def lock_command(
    *, run_id: str, host: str, pid: int, silence: float = LOCK_SILENCE_SECONDS
) -> list[str]:
    """argv that takes the session's exec lock for this exec (run `run_id`, from laptop
    `host`, process `pid`) and holds it until its stdin's EOF or `silence` seconds
    without a heartbeat byte, or says who holds it."""
    holder = json.dumps({"run_id": run_id, "host": host, "pid": pid}, sort_keys=True)
    # -I -S: the system python3 alone, no user site or PYTHON* variables to shadow
    # fcntl and json, and a faster start (it is on every exec's path).
    return ["python3", "-I", "-S", "-c", _lock_source(), LOCK_PATH, holder, f"{silence:g}"]


@dataclass(frozen=True)
class LockHolder:
    """Who holds the exec lock, as its holder wrote it (None: not written, or unreadable):
    the exec's run id, the laptop's hostname and pid, when it took it (VM wall clock).
    `tpulab down` takes the lock too, as `down-<the session's run id>`."""

    run_id: str | None
    host: str | None
    pid: int | None
    since: float | None

    @property
    def is_down(self) -> bool:
        """Held by a `tpulab down` deleting the node, not by an exec."""
        return (self.run_id or "").startswith(DOWN_LOCK_PREFIX)


# The run id a `tpulab down` writes into the exec lock it holds for the delete.
DOWN_LOCK_PREFIX = "down-"


def parse_lock_report(stdout: str) -> LockHolder | None:
    """None when the lock is ours; who holds it otherwise; ValueError when the output is
    not the lock script's."""
    line = next((x for x in stdout.splitlines() if x.startswith(LOCK_MARKER)), None)
    if line is None:
        raise ValueError(f"no {LOCK_MARKER.strip()} line in {stdout[-200:]!r}")
    said = line[len(LOCK_MARKER) :].strip()
    if said == "locked":
        return None
    verdict, _, note_json = said.partition(" ")
    if verdict != "held":
        raise ValueError(f"the lock script said {said[:80]!r}")
    try:
        note = json.loads(note_json)
    except ValueError:
        note = None
    note = note if isinstance(note, dict) else {}

    def text(key: str) -> str | None:
        value = note.get(key)
        return str(value) if isinstance(value, (str, int)) and str(value) else None

    pid = note.get("pid")
    since = note.get("since")
    return LockHolder(
        run_id=text("run_id"),
        host=text("host"),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        since=float(since) if isinstance(since, (int, float)) else None,
    )
