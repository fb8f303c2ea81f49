"""`tpulab ssh S -L ... [-N]` and `tpulab ssh-config`: a session's VM from the laptop's
browser and editor, through the system OpenSSH client with the session's pins
(tpulab.remote.system_ssh; the forward and its lease in tpulab.run.forward, the SSH
config entries in tpulab.cleanup.ssh_config)."""

import contextlib
import signal
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from tpulab import errors as E
from tpulab.cli._console import print_stderr
from tpulab.cli._exit import guarded

if TYPE_CHECKING:
    from tpulab.cleanup.sessions import SessionFiles, SessionStore
    from tpulab.config.forward import Forward
    from tpulab.remote.system_ssh import SystemSsh
    from tpulab.run.lease import LeaseRenewer
    from tpulab.run.session_state import SessionState

__all__ = ["connect_renewed", "interrupt_on_term", "ssh_config_command", "ssh_session"]


@contextlib.contextmanager
def interrupt_on_term() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal) end the forward as Ctrl-C does: its ssh
    child, in a process group of its own, must never be left holding the port."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def connect_renewed(
    store: "SessionStore", files: "SessionFiles", *, background: bool, worker: int = 0
) -> "tuple[SystemSsh, LeaseRenewer, SessionState]":
    """Worker `worker`'s OpenSSH client (0: the only one of a single host), the
    session's lease renewed once on EVERY worker (each worker's watchdog reads its own
    lease; a slice's renewal that misses one fails, naming it), and, with `background`,
    from then on until the renewer is stopped. A node that does not answer is asked of
    the API: moved -> reached where it is now, with the pinned host key (and the
    session's state, returned, says so); gone -> the session is concluded gone (exit 4,
    saying why). ConfigError (exit 2) for a worker the node has not, before anything is
    sent."""
    from tpulab.cli._session_reach import readdressed_session, refuse_unreachable
    from tpulab.run.forward import wall_time_of

    state = files.state
    state.check_worker(worker)
    if not files.key_path.is_file():
        raise E.ConfigError(
            f"Session {state.name} has no key file at {files.key_path}.",
            hint=f"End it with `tpulab down {state.name}` and start a new one.",
        )
    shells = _worker_shells(state, files)
    renewer = _renewing(state, shells, background=background)
    if renewer.renewals == 0:
        renewer.stop()
        # Before any "may have deleted itself": the node may only have moved. Ask the
        # API where it is, save it, and try once more there with the same pinned key.
        moved = readdressed_session(state)
        if moved is not None:
            store.save(moved)
            state = moved
            shells = _worker_shells(state, files)
            renewer = _renewing(state, shells, background=background)
    if renewer.renewals == 0:
        renewer.stop()
        refuse_unreachable(store, state, renewer.failures[-1] if renewer.failures else "no answer")
    renewer.note = lambda message: print_stderr(f"[yellow]lease:[/] {message}")
    store.save(state.renewed(wall_time_of(renewer)))
    return shells[worker], renewer, state


def _worker_shells(state: "SessionState", files: "SessionFiles") -> "list[SystemSsh]":
    """Each worker's OpenSSH client, worker 0 first, each with its own pinned known_hosts
    beside the session's key (worker 0's is the one `tpulab ssh-config` names)."""
    from tpulab.cleanup.ssh_config import known_hosts_path
    from tpulab.remote.system_ssh import SystemSsh, write_known_hosts

    shells: list[SystemSsh] = []
    try:
        for index, target in enumerate(state.worker_targets()):
            known = known_hosts_path(files)
            if index:
                known = known.with_name(f"{known.name}.worker-{index}")
            write_known_hosts(known, target)
            shells.append(SystemSsh(target, files.key_path, known))
    except E.RemoteError as error:  # a pinned key in session.json that does not parse
        raise E.RemoteError(
            f"Could not reach session {state.name}: its pinned host key is unusable "
            f"({error.message}); nothing was sent.",
            hint=f"End it with `tpulab down {state.name}` and start a new one.",
        ) from None
    return shells


def _renewing(
    state: "SessionState", shells: "list[SystemSsh]", *, background: bool
) -> "LeaseRenewer":
    """The session's renewer over every worker at once (tpulab.run.workers.EveryWorker;
    a single host's one client as is), started: renewed once now."""
    from tpulab.run.forward import session_renewer
    from tpulab.run.workers import EveryWorker

    renewer = session_renewer(shells[0] if len(shells) == 1 else EveryWorker(shells), state)
    renewer.background = background
    renewer.start()
    return renewer


def ssh_session(
    store: "SessionStore",
    files: "SessionFiles",
    command: list[str],
    forwards: "Sequence[Forward]" = (),
    *,
    forward_only: bool = False,
    worker: int = 0,
) -> int:
    """`tpulab ssh`: a shell or `-- CMD` on worker `worker` (lease renewed first, on every
    worker), with `-L` forwards beside it (lease renewed while they are open), or
    forwards only (`-N`)."""
    import subprocess

    from tpulab.cli._session_reach import ForwardReopening
    from tpulab.run.forward import (
        Forwarding,
        check_local_ports_free,
        forward_argv,
        wall_time_of,
    )

    if forwards:
        check_local_ports_free(forwards)
    ssh, renewer, state = connect_renewed(store, files, background=bool(forwards), worker=worker)
    if not forwards:
        return subprocess.run(ssh.argv(remote=command, typed=True), check=False).returncode

    def save_renewal() -> None:
        if store.exists(state.name):
            store.save(state.renewed(wall_time_of(renewer)))

    argv = forward_argv(ssh, forwards, command=None if forward_only else command)
    forwarding = Forwarding(argv, forwards)
    try:
        with interrupt_on_term():
            forwarding.start(own_group=forward_only)
            if forward_only:
                forwarding.wait_listening()
                _say_forwarding(state.name, forwards)
            status = forwarding.hold(
                renewer,
                on_renewed=save_renewal,
                reopen=ForwardReopening(store, state) if forward_only else None,
            )
    except KeyboardInterrupt:
        if not forward_only:
            raise
        typer.echo(f"Forward to session {state.name} closed.")
        return 0
    finally:
        forwarding.end()
        renewer.stop()
        save_renewal()
    if forward_only:
        from tpulab.cli._session_reach import raise_if_gone

        raise_if_gone(store, state)
        raise E.RemoteError(
            f"The forward to session {state.name} ended by itself (ssh exit {status}).",
            hint=f"Its message is above; `tpulab ssh {state.name} -- true` checks the connection.",
        )
    return status


def _say_forwarding(name: str, forwards: "Sequence[Forward]") -> None:
    for forward in forwards:
        where = f"{forward.host}:{forward.remote_port}"
        typer.echo(f"Forwarding {forward.local_url()} -> {where} on session {name}'s VM.")
        if not forward.loopback_only:
            print_stderr(
                f"[yellow]warning:[/] -L binds {forward.bind}: other machines that reach this "
                "laptop reach the VM's port too."
            )
    typer.echo("The idle lease is renewed while the forward is open; Ctrl-C ends it.")


def ssh_config_command(
    name: Annotated[
        str | None, typer.Argument(metavar="S", help="The session (omit if only one is up).")
    ] = None,
    all_sessions: Annotated[bool, typer.Option("--all", help="Every session.")] = False,
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="Write the entries and Include them from ~/.ssh/config (one line at its top, "
            "added once, after a backup).",
        ),
    ] = False,
) -> None:
    """Print a session's `Host tpulab-S` entry for ssh, scp and VS Code Remote-SSH.

    The entry pins the VM's host key (StrictHostKeyChecking yes) and the session's own
    key. With --write, `ssh tpulab-S` works as is; `tpulab down S` (or the VM deleting
    itself) removes the entry with the session.
    """

    def action() -> None:
        from tpulab.cleanup.sessions import SessionStore

        if all_sessions and name is not None:
            raise E.ConfigError("Pass a session name or --all, not both.")
        store = SessionStore()
        chosen = store.all() if all_sessions else [store.resolve(name)]
        if not chosen:
            raise E.ConfigError(
                "No session is up.", hint="Start one with `tpulab up --accelerator TYPE`."
            )
        _ssh_config(store, chosen, write=write)

    guarded(action)


def _ssh_config(store: "SessionStore", chosen: "list[SessionFiles]", *, write: bool) -> None:
    from tpulab.cleanup.ssh_config import (
        ensure_include,
        host_alias,
        host_block,
        known_hosts_path,
        write_entry,
    )
    from tpulab.remote.system_ssh import write_known_hosts
    from tpulab.run.forward import session_target

    for files in chosen:
        # The entry names the pinned known_hosts: it exists whenever the entry is shown.
        write_known_hosts(known_hosts_path(files), session_target(files.state))
        if not write:
            typer.echo(host_block(files))
            continue
        path = write_entry(files)
        typer.echo(f"Wrote Host {host_alias(files.state.name)} to {path}.")
    if not write:
        return
    change = ensure_include(store)
    if change.added:
        saved = f" (your previous config is in {change.backup})" if change.backup else ""
        typer.echo(f"Added its Include line at the top of {change.config}{saved}.")
    else:
        typer.echo(f"{change.config} already includes it.")
    first = host_alias(chosen[0].state.name)
    typer.echo(f'Try `ssh {first}`, or VS Code\'s "Remote-SSH: Connect to Host..." {first}.')
