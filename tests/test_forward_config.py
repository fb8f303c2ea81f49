"""The parts of `tpulab ssh -L`, `ssh-config` and `notebook` that need no VM: the -L
specs (refused with exit 2 before anything is read), the Include line put into a
temporary HOME's ~/.ssh/config, the renewer's first lease line."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from helpers import invoke

from tpulab.cleanup.sessions import SessionStore
from tpulab.cleanup.ssh_config import BACKUP_SUFFIX, ensure_include, include_line
from tpulab.config.forward import Forward, parse_forward, parse_forwards
from tpulab.errors import ConfigError
from tpulab.remote.watchdog import WatchdogConfig
from tpulab.run.lease import LeaseRenewer
from tpulab.run.session_state import SessionState

EXIT_CONFIG = 2


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("8888", Forward(port=8888)),
        ("18080:localhost:8000", Forward(18080, "localhost", 8000)),
        ("127.0.0.1:6006", Forward(6006, bind="127.0.0.1")),
        ("0.0.0.0:9001:localhost:9001", Forward(9001, "localhost", 9001, bind="0.0.0.0")),
        ("[::1]:8080:[::1]:80", Forward(8080, "[::1]", 80, bind="[::1]")),
    ],
)
def test_forward_specs_as_openssh_reads_them(spec: str, expected: Forward) -> None:
    forward = parse_forward(spec)
    assert forward == expected
    assert forward.ssh_arg.endswith(f"{forward.host}:{forward.remote_port}")


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("0", "not a TCP port"),
        ("65536", "not a TCP port"),
        ("http", "not a TCP port"),
        ("8080:localhost", "PORT 'localhost'"),  # BIND:PORT: the port comes second
        ("8080:bad host:80", "HOST 'bad host'"),
        ("1:2:3:4:5", "is not [BIND:]PORT[:HOST:HOSTPORT]"),
        ("8080::80", "is not [BIND:]PORT[:HOST:HOSTPORT]"),
        ("8080:localhost:0", "HOSTPORT '0'"),
    ],
)
def test_bad_forward_specs_are_refused_naming_the_part(spec: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_forward(spec)
    assert said in refused.value.message
    assert refused.value.hint


def test_the_same_local_port_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="local port 8080 is given twice"):
        parse_forwards(["8080", "8080:localhost:9090"])


@pytest.mark.parametrize(
    "args",
    [
        ["ssh", "nosuch", "-L", "99999", "-N"],
        ["ssh", "nosuch", "-L", "8080:bad host:80"],
        ["ssh", "nosuch", "-N"],
        ["notebook", "nosuch", "--port", "0"],
    ],
)
def test_the_cli_refuses_bad_forwards_before_reading_any_session(args: list[str]) -> None:
    # No session named "nosuch" exists: the flag's own error comes first.
    status, out, err = invoke(*args)
    assert status == EXIT_CONFIG
    text = out + err
    assert "There is no session" not in text
    assert any(word in text for word in ("-L", "--port", "-N"))


def test_include_goes_on_top_once_with_a_backup(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "state" / "sessions")
    config = tmp_path / "home" / ".ssh" / "config"
    config.parent.mkdir(parents=True)
    mine = "Host *\n  ServerAliveInterval 30\n\nHost work\n  User me\n"
    config.write_text(mine)
    config.chmod(0o640)

    first = ensure_include(store, config)
    assert first.added
    text = config.read_text()
    lines = text.splitlines()
    # Before any Host block (an Include inside one would apply to that block only).
    assert lines[1] == include_line(store)
    assert text.endswith(mine)  # the user's lines, byte for byte
    assert first.backup == config.with_name("config" + BACKUP_SUFFIX)
    assert first.backup.read_text() == mine
    assert config.stat().st_mode & 0o777 == 0o640

    again = ensure_include(store, config)
    assert not again.added
    assert config.read_text() == text


def test_include_writes_through_a_symlinked_config_and_creates_a_missing_one(
    tmp_path: Path,
) -> None:
    store = SessionStore(tmp_path / "sessions")
    dotfiles = tmp_path / "dotfiles" / "ssh_config"
    dotfiles.parent.mkdir()
    dotfiles.write_text("Host a\n  User b\n")
    link = tmp_path / "home" / ".ssh" / "config"
    link.parent.mkdir(parents=True)
    link.symlink_to(dotfiles)
    ensure_include(store, link)
    assert link.is_symlink()
    assert dotfiles.read_text().endswith("Host a\n  User b\n")
    assert include_line(store) in dotfiles.read_text()

    fresh = tmp_path / "other" / ".ssh" / "config"
    made = ensure_include(store, fresh)
    assert made.added
    assert made.backup is None
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert fresh.parent.stat().st_mode & 0o777 == 0o700


class _Lines:
    """A RemoteShell seam that records the lease lines written."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        on_line: Callable[[str, str], None] | None = None,
        check: bool = False,
    ) -> object:
        self.lines.append(list(argv)[4])
        return None


def test_a_second_renewer_never_writes_the_line_the_first_left() -> None:
    """The watchdog counts a renewal only when the lease file changes: a forward opened
    after an exec must not start from the exec's seq."""
    from tpulab.run.forward import session_renewer

    config = WatchdogConfig("r", "n", "z", "p", 60.0, 60.0, 3600.0)
    shell = _Lines()
    LeaseRenewer(shell, config, background=False).start()  # an exec's renewer
    state = _state(config)
    forward = session_renewer(shell, state, wall_clock=lambda: 1_000.0)  # type: ignore[arg-type]
    forward.background = False
    forward.start()
    assert len(shell.lines) == 2
    assert shell.lines[0] != shell.lines[1]


def _state(config: WatchdogConfig) -> SessionState:
    from dataclasses import asdict

    return SessionState(
        name="s", run_id="r", node_name="n", zone="z", project="p", api_endpoint=None,
        accelerator_type="v5litepod-4", spot=False, ssh_user="u", ssh_host="127.0.0.1",
        ssh_port=22, host_key_type="ssh-ed25519", host_key_b64="AAAA", watchdog=asdict(config),
        started_at=0.0, deadline_at=3600.0, idle_seconds=60.0, renewed_at=0.0,
    )  # fmt: skip


def test_ssh_config_needs_a_session_or_all_not_both() -> None:
    status, out, err = invoke("ssh-config", "s", "--all")
    assert status == EXIT_CONFIG
    assert "--all, not both" in out + err


def test_a_session_found_gone_takes_its_ssh_entry_with_it(tmp_path: Path) -> None:
    """`conclude_gone` (--ttl/--idle expiry seen by list, ssh, exec, down, the sweep)
    removes the session's directory, and with it the Host entry the Include reads."""
    from tpulab.cleanup.sessions import SessionFiles, conclude_gone, why_gone
    from tpulab.cleanup.ssh_config import host_block, write_entry
    from tpulab.remote.keys import RunKey

    store = SessionStore(tmp_path / "sessions")
    key = RunKey()
    config = WatchdogConfig("r", "n", "z", "p", 60.0, 60.0, 3600.0)
    state = _state(config)
    key_path = store.reserve(state.name, key.openssh_private_bytes())
    store.save(state)
    files = SessionFiles(state, key_path)
    entry = write_entry(files)
    assert entry.read_text() == host_block(files)
    assert "Host tpulab-s\n" in entry.read_text()
    assert "StrictHostKeyChecking yes" in entry.read_text()
    concluded = conclude_gone(store, state, why_gone(state, now=7200.0), seen_by="test")
    assert concluded.vanish.cause == "idle"
    assert not entry.exists()
