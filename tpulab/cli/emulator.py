"""`tpulab emulator serve`: the offline Cloud TPU API emulator in the foreground.

It runs tpulab.emulator until Ctrl-C or SIGTERM; gcloud and `tpulab run
--api-endpoint` can both talk to it.
"""

import sys
from typing import Annotated

import typer

from tpulab import errors as E
from tpulab.cli._console import print_stderr
from tpulab.cli._exit import guarded
from tpulab.cli._panels import HelpInPanels

__all__ = ["emulator_app"]

emulator_app = HelpInPanels(
    help="The offline Cloud TPU API emulator (also usable with gcloud).",
    no_args_is_help=True,
)


@emulator_app.command("serve")
def emulator_serve_command(
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free).")] = 8470,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    state: Annotated[
        str | None,
        typer.Option("--state", help="State directory (default: tpulab's emulator state)."),
    ] = None,
    ssh: Annotated[
        str,
        typer.Option("--ssh", help="SSH hosts behind READY nodes: embedded, openssh or none."),
    ] = "embedded",
    create_seconds: Annotated[
        float, typer.Option("--create-seconds", help="Seconds from CREATING to READY.")
    ] = 3.0,
    delete_seconds: Annotated[
        float, typer.Option("--delete-seconds", help="Seconds from DELETING to gone.")
    ] = 1.0,
) -> None:
    """Serve the Cloud TPU API emulator in the foreground until Ctrl-C."""

    def action() -> None:
        _serve(port, host, state, ssh, create_seconds, delete_seconds)

    guarded(action)


def _serve(
    port: int, host: str, state: str | None, ssh: str, create_seconds: float, delete_seconds: float
) -> None:
    import signal
    import threading
    from pathlib import Path

    from tpulab import paths
    from tpulab.config import EMULATED_PROJECT, EMULATED_ZONE
    from tpulab.emulator import Emulator, Timing

    if ssh not in {"embedded", "openssh", "none"}:
        raise E.ConfigError(f"Unknown --ssh {ssh!r}.", hint="Use embedded, openssh or none.")
    if not 0 <= port <= 65535:
        raise E.ConfigError(f"Invalid --port {port}.", hint="Use 0..65535 (0: any free port).")
    if not host.strip():
        # An empty address would bind every interface, silently.
        raise E.ConfigError(
            "--host is empty.",
            hint="Give the address to listen on: 127.0.0.1 (the default: this machine only) "
            "or 0.0.0.0 (every interface; the emulator has no authentication).",
        )
    try:
        timing = Timing(create_seconds=create_seconds, delete_seconds=delete_seconds)
    except ValueError as error:
        raise E.ConfigError(
            f"Invalid --create-seconds or --delete-seconds: {error}.",
            hint="Give a finite number of seconds >= 0, e.g. --create-seconds 3.",
        ) from None
    state_dir = Path(state).expanduser() if state else paths.emulator_state_dir()
    emulator = Emulator(state_dir, timing=timing, host=host, port=port)
    # The state directory and file, read once before anything is built in them (the SSH
    # hosts' image directory first): `--state FILE` or a damaged state.json is a clear
    # EmulatorStateError here, not a traceback from wherever they were first touched.
    emulator.check_state()
    backend = None
    if ssh != "none":
        from tpulab.app.embedded import load_image_kind
        from tpulab.emulator.backends import make_host_backend

        # Built before anything listens: a missing sshd is refused here, at start; so is
        # an image.json naming no image.
        backend = make_host_backend(
            "openssh" if ssh == "openssh" else "embedded",
            state_dir,
            image=load_image_kind(state_dir),
        )
        emulator.host_backend = backend
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        try:
            url = emulator.start()
        except OSError as error:
            raise E.ConfigError(
                f"Cannot listen on {host}:{port}: {error.strerror or error}.",
                hint="Pick another --port (or --port 0 for any free one).",
            ) from None
        typer.echo(f"Cloud TPU API emulator listening on {url}", err=False)
        typer.echo(f"  state: {state_dir}  ssh hosts: {ssh}")
        typer.echo(
            f"  tpulab: tpulab run --accelerator v5litepod-4 --api-endpoint {url} "
            f"--project {EMULATED_PROJECT} --zone {EMULATED_ZONE}"
        )
        typer.echo(
            f"  gcloud: export CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU={url}/ "
            f"CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true CLOUDSDK_CORE_PROJECT={EMULATED_PROJECT}"
        )
        typer.echo(f"  faults: curl -X POST {url}/_emulator/faults -d '{{\"stockout\": true}}'")
        typer.echo("Press Ctrl-C to stop.")
        if host not in {"127.0.0.1", "localhost", "::1"}:
            print_stderr(
                f"[yellow]warning:[/] listening on {host}: anyone who can reach it can create "
                "nodes and inject faults (the emulator has no authentication)."
            )
        sys.stdout.flush()
        try:
            while not stop.wait(0.5):
                if emulator.failure is not None:
                    raise emulator.failure  # e.g. state.json was corrupted under us
        except KeyboardInterrupt:
            pass
    finally:
        emulator.stop()
        if backend is not None:
            backend.close()
        signal.signal(signal.SIGTERM, previous)
    typer.echo("Emulator stopped; its state is kept in " + str(state_dir))
