"""What every session command shares: its store (naming damaged state files on the way
out), and what to conclude when its node does not answer (moved, another machine at its
address, or gone). `up`/`down`/`ssh` (session.py), `-L` (forward.py), `exec` and
`notebook` use these; none of them imports another command's module for them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tpulab import errors as E
from tpulab.cli._console import print_stderr

if TYPE_CHECKING:
    from tpulab.cleanup.sessions import SessionStore
    from tpulab.cloud.api import TpuApi
    from tpulab.run.session_state import SessionState

__all__ = [
    "ForwardReopening",
    "raise_if_gone",
    "readdressed_session",
    "refuse_unreachable",
    "session_api",
    "session_store",
]


def session_api(state: SessionState, *, quiet: bool = False) -> TpuApi:
    """The API the session's node lives behind, by the provider its state names (a TPU
    node through the Cloud TPU API, an instance through Compute Engine): every command
    that finds, follows or deletes a session's node asks it through this. `quiet`: an
    endpoint not answering yet is retried without a line for each try."""
    from tpulab.app.target import provider_api
    from tpulab.cli._target import reach_notice

    return provider_api(
        state.project,
        provider=state.provider,
        api_endpoint=state.api_endpoint,
        notify=None if quiet else reach_notice,
    )


@contextmanager
def session_store() -> Iterator[SessionStore]:
    """The sessions' store for one command; on the way out (an error's included) each
    damaged state file it set aside is named on stderr -- except the one the command's
    own error already names (`tpulab ssh c1` of a damaged c1)."""
    from tpulab.cleanup.sessions import SessionStore

    store = SessionStore()
    said: str | None = None
    try:
        yield store
    except E.StateFileError as error:
        said = error.message
        raise
    finally:
        for damaged in store.damaged:
            if damaged.error().message != said:
                print_stderr(f"[yellow]warning:[/] {damaged.message}")


class ForwardReopening:
    """How a session's forward (`tpulab ssh S -L ... -N`, `tpulab notebook`) that lost
    its connection says so, and asks whether the node is still there to reopen it to:
    the session's state is still here, and the API does not say it is gone."""

    def __init__(self, store: SessionStore, state: SessionState) -> None:
        self.store, self.state = store, state

    def note(self, message: str) -> None:
        print_stderr(f"[yellow]forward:[/] {message}")

    def gone(self) -> bool:
        from tpulab.cleanup.sessions import ask_gone

        if not self.store.exists(self.state.name):  # `tpulab down` from elsewhere
            return True
        # Asked before each reopen: offline, the API does not answer either, and a line
        # per retry of each ask would bury the forward's own.
        return ask_gone(session_api(self.state, quiet=True), self.state) is not None


def raise_if_gone(store: SessionStore, state: SessionState) -> None:
    """The node did not answer: if the API says it is gone, say why, clean up, and exit
    EXIT_REMOTE (NodeVanishedError); if it is still there, return (a plain SSH failure)."""
    from tpulab.cleanup.sessions import ask_gone, conclude_gone

    if not store.exists(state.name):
        # Ended meanwhile from here: not "deleted by someone else", which the API's
        # answer alone would conclude.
        raise E.NodeVanishedError(
            f"Session {state.name} ended meanwhile: its state was removed on this machine "
            "(`tpulab down`, or a `tpulab list` that found its node gone).",
            hint="Start a new one with `tpulab up`.",
        )
    vanish = ask_gone(session_api(state), state)
    if vanish is None:
        return
    concluded = conclude_gone(store, state, vanish, seen_by="tpulab ssh")
    for warning in concluded.warnings:
        print_stderr(f"[yellow]journal:[/] {warning}")
    raise concluded.error()


def readdressed_session(state: SessionState) -> SessionState | None:
    """The session at its node's current address when the API says it moved (a new
    ephemeral IP, a restarted emulator's port); None when it did not or cannot say."""
    from tpulab.run.session import readdressed

    moved = readdressed(session_api(state), state)
    if moved is None:
        return None
    pairs = zip(state.worker_targets(), moved.worker_targets(), strict=True)
    for index, (was, now) in enumerate(pairs):
        if (was.host, was.port) == (now.host, now.port):
            continue
        whose = "node" if state.worker_count == 1 else f"worker {index}"
        print_stderr(
            f"Session {state.name}'s {whose} moved from {was.host}:{was.port} "
            f"to {now.host}:{now.port} ({_get_call(state)}); reaching it there."
        )
    return moved


def _get_call(state: SessionState) -> str:
    """The API call that says where a session's node is, in the provider's own words."""
    return "instances.get" if state.provider == "compute" else "GetNode"


def refuse_unreachable(store: SessionStore, state: SessionState, why: str) -> None:
    """SSH to the session failed where the API says its node is: a host key that is not
    the pinned one is named as such; a node gone is concluded gone (raise_if_gone);
    else the plain failure. Always raises."""
    # A slice's failure names its worker (tpulab.run.workers.EveryWorker): its address
    # is then not worker 0's, which is all the session's top-level fields say.
    where = f"at {state.ssh_host}:{state.ssh_port}" if state.worker_count == 1 else "(a worker)"
    if "host key verification failed" in why.lower():
        # The pin holds at any address: another machine there is never logged in to.
        raise E.HostKeyMismatchError(
            f"Session {state.name}'s node {where} does not present the host key `up` "
            f"pinned ({state.host_key_type}): refused ({why}).",
            hint="Something else answers at the node's address, or the node was rebuilt: "
            f"end the session with `tpulab down {state.name}` and start a new one.",
        )
    raise_if_gone(store, state)
    raise E.RemoteError(
        f"Could not reach session {state.name} {where} to renew its lease ({why}).",
        hint=f"{_get_call(state)} did not say it is gone: check your network, or `tpulab down "
        f"{state.name}` to end it.",
    )
