"""`tpulab notebook S [--port P]`: JupyterLab on a session's VM, in its synced workspace,
opened in this laptop's browser through an SSH forward (tpulab.remote.notebook for the
VM's half, tpulab.run.forward for the forward and the lease)."""

import contextlib
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from tpulab import errors as E
from tpulab.cli._console import print_stderr
from tpulab.cli._exit import guarded

if TYPE_CHECKING:
    from tpulab.cleanup.sessions import SessionFiles, SessionStore
    from tpulab.config.commands import Installer
    from tpulab.remote.system_ssh import SystemSsh
    from tpulab.run.lease import LeaseRenewer

__all__ = ["notebook_command"]

DEFAULT_PORT = 8888
INSTALL_TIMEOUT = 1200.0
START_TIMEOUT = 300.0
STOP_TIMEOUT = 90.0


def notebook_command(
    name: Annotated[
        str | None, typer.Argument(metavar="S", help="The session (omit if only one is up).")
    ] = None,
    port: Annotated[
        int, typer.Option("--port", help="The local port the notebook opens on.")
    ] = DEFAULT_PORT,
    installer: Annotated[
        str, typer.Option("--installer", help="Installer for jupyterlab: uv (default) or pip.")
    ] = "uv",
    worker: Annotated[
        int,
        typer.Option(
            "--worker", metavar="N", help="A multi-host slice's worker to run it on (default 0)."
        ),
    ] = 0,
) -> None:
    """Start JupyterLab on the session's VM and open it here: prints the URL with its token.

    JupyterLab is installed into the session's venv as `tpulab exec --with jupyterlab`
    would (once); it runs in the synced workspace (what `tpulab exec` uploads), bound
    to the VM's localhost, reached only through the SSH forward. The idle lease is
    renewed while it runs; Ctrl-C stops Jupyter on the VM (confirmed) and exits 0.
    """

    def action() -> int:
        from tpulab.cleanup.sessions import SessionStore
        from tpulab.config.commands import installer_choice
        from tpulab.config.forward import check_port

        check_port("--port", port)
        chosen = installer_choice(installer)
        store = SessionStore()
        return _notebook(store, store.resolve(name), port, chosen, worker)

    status = guarded(action)
    raise typer.Exit(status if isinstance(status, int) else 0)


@contextlib.contextmanager
def _finishing(what: str) -> Iterator[None]:
    """A second Ctrl-C (or SIGTERM) while `what` runs says so instead of abandoning it:
    a Jupyter left running on the VM would hold the TPU for the next command."""

    def refuse(_signum: int, _frame: object) -> None:
        print_stderr(f"[yellow]{what}: a moment.[/]")

    previous = {s: signal.signal(s, refuse) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _notebook(
    store: "SessionStore", files: "SessionFiles", port: int, installer: "Installer", worker: int
) -> int:
    from tpulab.cli.forward import connect_renewed, interrupt_on_term
    from tpulab.config.forward import Forward
    from tpulab.run.forward import check_local_ports_free, wall_time_of

    check_local_ports_free([Forward(port=port)])
    # The lease is renewed on every worker of a slice; Jupyter runs on `worker`.
    ssh, renewer, state = connect_renewed(store, files, background=True, worker=worker)
    started = stopped = False
    try:
        with interrupt_on_term():
            _install(ssh, installer)
            started = True  # from here on, Jupyter may run on the VM: stop it at the end
            _serve(store, files, ssh, renewer, port)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a notebook ends: stopped below, exit 0
    finally:
        stopped = _stop(ssh, state.name) if started else True
        renewer.stop()
        if store.exists(state.name):
            store.save(state.renewed(wall_time_of(renewer)))
    return 0 if stopped else 4


def _install(ssh: "SystemSsh", installer: "Installer") -> None:
    from tpulab.remote.bootstrap import install_extras
    from tpulab.remote.notebook import JUPYTER_PACKAGE, notebook_extras

    typer.echo(
        f"Installing {JUPYTER_PACKAGE} into the session's venv (as `--with "
        f"{JUPYTER_PACKAGE}`; once)..."
    )
    result = install_extras(ssh, notebook_extras(), installer=installer, timeout=INSTALL_TIMEOUT)
    version = result.versions.get(JUPYTER_PACKAGE)
    typer.echo(f"{JUPYTER_PACKAGE} {version}: {result.install}.")


def _serve(
    store: "SessionStore",
    files: "SessionFiles",
    ssh: "SystemSsh",
    renewer: "LeaseRenewer",
    port: int,
) -> None:
    """Start Jupyter, forward it, print the URL, hold until Ctrl-C (KeyboardInterrupt);
    RemoteError if Jupyter does not start or the forward ends by itself."""
    import secrets  # here, not at the top: hashlib and random cost `tpulab --help` ~10 ms

    from tpulab.cli._session_reach import ForwardReopening, raise_if_gone
    from tpulab.config.forward import Forward
    from tpulab.remote.notebook import parse_started, start_command
    from tpulab.run.forward import Forwarding, forward_argv, wall_time_of

    state = files.state
    token = secrets.token_urlsafe(32)
    done = ssh.run(start_command(), timeout=START_TIMEOUT, input=token + "\n")
    if done.exit_status != 0:
        tail = (done.stderr.strip() or done.stdout.strip())[-1500:]
        raise E.RemoteError(
            f"Jupyter did not start on session {state.name}'s VM (exit {done.exit_status}):\n{tail}"
        )
    server = parse_started(done.stdout)
    forward = Forward(port=port, host="127.0.0.1", host_port=server.port)
    forwarding = Forwarding(forward_argv(ssh, [forward], command=None), [forward])

    def save_renewal() -> None:
        if store.exists(state.name):
            store.save(state.renewed(wall_time_of(renewer)))

    try:
        forwarding.start(own_group=True)
        forwarding.wait_listening()
        url = forward.local_url(f"/lab?token={token}")
        typer.echo(f"JupyterLab on session {state.name} (in the synced workspace): {url}")
        typer.echo("The idle lease is renewed while it runs; Ctrl-C stops it on the VM.")
        status = forwarding.hold(
            renewer, on_renewed=save_renewal, reopen=ForwardReopening(store, state)
        )
    finally:
        forwarding.end()
    raise_if_gone(store, state)
    raise E.RemoteError(f"The forward to the notebook ended by itself (ssh exit {status}).")


def _stop(ssh: "SystemSsh", name: str) -> bool:
    """Stop Jupyter on the VM and say so once it is confirmed gone; False if not."""
    from tpulab.remote.notebook import parse_stopped, stop_command

    with _finishing("Stopping Jupyter on the VM"):
        try:
            done = ssh.run(stop_command(), timeout=STOP_TIMEOUT)
            pid, how = parse_stopped(done.stdout)
        except E.RemoteError as error:
            print_stderr(
                f"[red]Jupyter may still run on session {name}'s VM:[/] {error.message}\n"
                f"Stop it with `tpulab notebook {name}` then Ctrl-C, or `tpulab down {name}`."
            )
            return False
    if how == "none":
        typer.echo("Jupyter is not running on the VM (nothing to stop).")
    else:
        typer.echo(f"Jupyter stopped on the VM (pid {pid}, SIG{how}); confirmed gone.")
    return True
