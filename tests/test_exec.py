"""`tpulab exec` as a user types it: real subprocesses against an emulator served from
this process (the session outlives each command, so the emulator must too), whose nodes
are real SSH servers; `ssh` goes through the system's OpenSSH client. Nothing is
mocked; every test ends by asking the emulator what is left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import (
    cli_imports,
    invoke,
    require_tool,
    served_emulator,
    tpulab,
    wait_until,
    watchdog_saw_the_last_renewal,
)

from tpulab.cleanup.journal import Journal
from tpulab.emulator import Emulator

pytestmark = pytest.mark.slow

PROJECT = "exec-proj"
ZONE = "us-central1-a"
LAB = Path(__file__).resolve().parent.parent / "examples" / "course_lab"
EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_REMOTE = 4
EXIT_WORKLOAD = 9
EXIT_INTERRUPTED = 130
TRAIN = ("python", "train.py", "--run-dir", "$TPULAB_RUN_DIR", "--steps", "5")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def up(emulator: Emulator, name: str, *extra: str) -> dict[str, object]:
    """`tpulab up --name NAME`; the session's state as written to disk."""
    done = tpulab(
        "up", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        "--project", PROJECT, "--zone", ZONE, "--boot-timeout", "30", "--name", name, *extra,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    return json.loads(session_dir(name).joinpath("session.json").read_text())  # type: ignore[no-any-return]


def session_dir(name: str) -> Path:
    return Path(os.environ["TPULAB_HOME"]) / "state" / "sessions" / name


def methods(emulator: Emulator) -> list[str]:
    return [f"{entry['method']} {entry['path']}" for entry in emulator.requests()]


def creates_sent(emulator: Emulator) -> list[str]:
    return [m for m in methods(emulator) if m.startswith("POST") and m.endswith("/nodes")]


def deletes(emulator: Emulator) -> list[str]:
    return [m for m in methods(emulator) if m.startswith("DELETE")]


def node_state(emulator: Emulator, node: str) -> str:
    listed = tpulab(
        "list", "--api-endpoint", emulator.url, "--project", PROJECT, "--zone", ZONE, "--json"
    )
    assert listed.returncode == EXIT_OK, listed.stderr
    found = [n for n in json.loads(listed.stdout)["nodes"] if n["name"] == node]
    return str(found[0]["state"]) if found else "gone"


def test_up_two_execs_ssh_down_costs(served: Emulator, tmp_path: Path) -> None:
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")
    state = up(served, "lesson", "--ttl", "1h", "--idle", "10m")
    assert isinstance(state["receipt_id"], str)
    (node,) = served.node_names(PROJECT)
    creates = creates_sent(served)

    first = tpulab(
        "exec", "lesson", "--workdir", str(LAB), "--out", str(tmp_path / "one"), "--", *TRAIN,
        timeout=300,
    )  # fmt: skip
    assert first.returncode == EXIT_OK, first.stderr + first.stdout
    assert "cmd ┃ training on 4 cpu device(s) for 5 steps" in first.stdout
    assert "Exec " in first.stdout
    assert "on session lesson" in first.stdout
    # The timings show what an exec skips: no create, no bootstrap, no verifier.
    (phases,) = [line for line in first.stdout.splitlines() if line.startswith("  phases")]
    assert "connect" in phases
    assert "workload" in phases
    assert "create" not in phases.split("(")[0]
    assert "bootstrap" not in phases.split("(")[0]
    assert (tmp_path / "one" / "run" / "checkpoints" / "step_00005.npz").is_file()
    record = json.loads((tmp_path / "one" / "run.json").read_text())
    assert record["command"] == "exec"
    assert record["session"] == "lesson"
    assert record["receipt_id"] == state["receipt_id"]
    assert record["node_name"] == node
    assert record["workload"]["exit_status"] == 0
    assert record["workload"]["upload_sent_files"] == record["workload"]["upload_files"] > 0
    assert "create" not in record["phase_seconds"]
    assert "bootstrap" not in record["phase_seconds"]
    renewed = json.loads(session_dir("lesson").joinpath("session.json").read_text())
    assert renewed["renewed_at"] > state["renewed_at"]

    # Something written in the session's workspace between execs (a checkpoint to
    # resume from) is still there after the next exec's sync.
    wrote = tpulab(
        "ssh", "lesson", "--", "mkdir -p jax-tpu-lab/workspace/ckpt && "
        "echo 5 > jax-tpu-lab/workspace/ckpt/step", timeout=60,
    )  # fmt: skip
    assert wrote.returncode == EXIT_OK, wrote.stderr

    # The second exec lands in its own --out; the node is the same one, never recreated.
    second = tpulab(
        "exec", "--workdir", str(LAB), "--out", str(tmp_path / "two"), "--json", "--", *TRAIN,
        timeout=300,
    )  # fmt: skip
    assert second.returncode == EXIT_OK, second.stderr + second.stdout
    again = json.loads(second.stdout)
    assert again["ok"] is True
    assert again["command"] == "exec"
    # The unchanged workspace is already on the VM: nothing of it is sent again.
    assert again["workload"]["upload_sent_files"] == 0
    assert again["workload"]["upload_sent_bytes"] == 0
    assert again["workload"]["upload_unchanged"] == again["workload"]["upload_files"] > 0
    assert (again["workload"]["upload_removed"], again["workload"]["upload_carried"]) == (0, 1)
    assert (tmp_path / "two" / "run" / "metrics.jsonl").is_file()
    assert creates_sent(served) == creates
    assert deletes(served) == []
    # `tpulab runs` finds the execs' records as it finds a run's.
    runs = tpulab("runs", "list", "--json", timeout=60)
    assert runs.returncode == EXIT_OK, runs.stderr
    listed = json.loads(runs.stdout)["runs"]
    assert [(r["run_id"], r["command"], r["session"]) for r in listed] == [
        (again["run_id"], "exec", "lesson"),
        (record["run_id"], "exec", "lesson"),
    ]

    shell = tpulab("ssh", "lesson", "--", "cat", "jax-tpu-lab/workspace/ckpt/step", timeout=60)
    assert shell.returncode == EXIT_OK, shell.stderr
    assert shell.stdout.strip() == "5"

    down = tpulab("down", "lesson", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr + down.stdout
    assert served.node_names(PROJECT) == []
    costs = tpulab("costs", "--json", timeout=60)
    assert costs.returncode == EXIT_OK, costs.stderr
    (entry,) = [e for e in json.loads(costs.stdout)["entries"] if e["run_id"] == state["run_id"]]
    # Billed from the create to the confirmed delete: the whole session, both execs in it.
    assert entry["billed_seconds"] > 0
    row = Journal().get(str(state["run_id"]))
    assert row is not None
    assert row.teardown == "confirmed"


def _exec_in_background(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tpulab", "exec", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def _wait_for(path: Path, process: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"exec ended before its command started: {err}{out}")
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.2)


def test_interrupted_and_failing_execs_keep_the_session(served: Emulator, tmp_path: Path) -> None:
    state = up(served, "keep", "--ttl", "1h", "--idle", "10m")
    node = str(state["node_name"])
    work = tmp_path / "work"
    work.mkdir()
    started = tmp_path / "started"
    # The emulated node runs on this machine: the command can tell the test it started.
    (work / "wait.py").write_text(
        "import os, pathlib, sys, time\n"
        "pathlib.Path(os.environ['TPULAB_RUN_DIR'], 'partial.txt').write_text('so far')\n"
        "pathlib.Path(sys.argv[1]).write_text('1')\n"
        "time.sleep(300)\n"
    )
    (work / "fail.py").write_text("print('about to fail', flush=True)\nraise SystemExit(6)\n")
    (work / "mark.py").write_text(
        "import os, pathlib, sys\n"
        "pathlib.Path(os.environ['TPULAB_RUN_DIR'], sys.argv[1]).write_text(sys.argv[1])\n"
        "print('marked', sys.argv[1])\n"
    )
    for number, signum in enumerate((signal.SIGINT, signal.SIGTERM)):
        out = tmp_path / f"stopped-{number}"
        started.unlink(missing_ok=True)
        process = _exec_in_background(
            "keep", "--workdir", str(work), "--out", str(out), "--", "python", "wait.py",
            str(started),
        )  # fmt: skip
        _wait_for(started, process)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == EXIT_INTERRUPTED, stderr + stdout
        # Stopped on the VM, then fetched: what it wrote so far came back.
        assert (out / "run" / "partial.txt").read_text() == "so far"
        record = json.loads((out / "run.json").read_text())
        assert record["workload"]["stopped"] is not None
        # The record says what ended it, as --json does (it once had "error": null).
        assert record["error"]["type"] == "InterruptedRun", record["error"]
        assert record["error"]["exit_status"] == EXIT_INTERRUPTED
        assert record["teardown"] == "not-created"
        assert deletes(served) == []
        assert node_state(served, node) == "READY"
        assert session_dir("keep").joinpath("key").is_file()

    # A failing command: its own status, exit 9, and the session stays.
    failing = tpulab(
        "exec", "keep", "--workdir", str(work), "--out", str(tmp_path / "fail"), "--",
        "python", "fail.py", timeout=300,
    )  # fmt: skip
    assert failing.returncode == EXIT_WORKLOAD, failing.stderr + failing.stdout
    assert "exited with status 6" in failing.stderr
    assert "about to fail" in (tmp_path / "fail" / "output.log").read_text()
    error = json.loads((tmp_path / "fail" / "run.json").read_text())["error"]
    assert (error["type"], error["exit_status"]) == ("WorkloadFailedError", EXIT_WORKLOAD)
    assert "exited with status 6" in error["message"]
    assert deletes(served) == []
    assert node_state(served, node) == "READY"

    # And exec works again after all that; each exec's run dir starts empty, so no
    # earlier exec's files (partial.txt, the first mark) ride back with a later one.
    for mark in ("first", "second"):
        done = tpulab(
            "exec", "--workdir", str(work), "--out", str(tmp_path / mark), "--",
            "python", "mark.py", mark, timeout=300,
        )  # fmt: skip
        assert done.returncode == EXIT_OK, done.stderr + done.stdout
    fetched = sorted(p.name for p in (tmp_path / "second" / "run").iterdir())
    assert fetched == ["second"]
    assert "marked first" not in (tmp_path / "second" / "output.log").read_text()
    assert "about to fail" not in (tmp_path / "second" / "output.log").read_text()
    assert deletes(served) == []
    down = tpulab("down", "keep", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []


# How long `tpulab exec` may take from its start to its check that the session has not
# expired (imports, reading the state) on a loaded runner: a bound, not a timing (a CLI
# start took ~10 s at load 12). The aged session's deadline is this far ahead when the
# exec starts.
EXEC_START_BOUND = 30.0


@pytest.mark.longest
def test_a_command_outliving_idle_keeps_its_node_and_ttl_ends_it_clearly(
    served: Emulator, tmp_path: Path
) -> None:
    # The --idle covers the gaps when nothing renews the lease (up's end to the first
    # exec's renewer, and the first exec's exit to the second one's: process start,
    # GetNode, SSH login): at 15 s a machine at load 12 let the node idle out there (CI,
    # 2026-12-01), and at 30 s one at load 8 did, before the first exec took over
    # (2026-12-06).
    state = up(served, "short", "--ttl", "180s", "--idle", "45s")
    booted_by = time.time()  # the VM's watchdog started before `up` returned
    work = tmp_path / "work"
    work.mkdir()
    (work / "nap.py").write_text(
        "import pathlib, sys, time\n"
        "if len(sys.argv) > 2:\n"
        "    pathlib.Path(sys.argv[2]).write_text('started')\n"
        "time.sleep(float(sys.argv[1]))\n"
    )
    # Longer than --idle: the exec renews the lease in the background, so the VM stays.
    long = tpulab(
        "exec", "short", "--workdir", str(work), "--out", str(tmp_path / "long"), "--",
        "python", "nap.py", "55", timeout=300,
    )  # fmt: skip
    assert long.returncode == EXIT_OK, long.stderr + long.stdout
    assert node_state(served, str(state["node_name"])) == "READY"

    # This one outlives the session's --ttl: the watchdog deletes the node under it.
    # The session is aged rather than waited for (the 180 s minimum --ttl was most of
    # this test's three minutes): its times on this machine move back now, so the
    # deadline is EXEC_START_BOUND away when the exec starts, and the VM's clock moves
    # forward by as much once the command runs and that deadline has passed here too.
    aged_by = float(str(state["deadline_at"])) - time.time() - EXEC_START_BOUND
    assert aged_by > 0, "up and the first exec took the whole --ttl"
    _age_session("short", aged_by)
    started = tmp_path / "nap-started"
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(
            tpulab,
            "exec", "short", "--workdir", str(work), "--out", str(tmp_path / "ended"), "--",
            "python", "nap.py", "300", str(started), timeout=300,
        )  # fmt: skip
        wait_until(lambda: started.exists() or running.done(), "the command to start", 120)
        assert started.exists(), running.result().stderr
        deadline_at = float(json.loads(session_file("short").read_text())["deadline_at"])
        time.sleep(max(0.0, deadline_at - time.time()))  # this machine's deadline, reached
        # The watchdog's deadline counts from its start, a little after up's started_at:
        # moving its clock that much further too makes the deadline, not the lease (whose
        # last renewal the skip outruns as well), what has passed when it next looks.
        boot_lag = booted_by - float(str(state["started_at"]))
        served.skip_vm_clock(PROJECT, ZONE, str(state["node_name"]), aged_by + boot_lag)
        ended = running.result()
    assert ended.returncode == EXIT_REMOTE, ended.stderr + ended.stdout
    assert (
        "Session short's node " + str(state["node_name"]) + " deleted itself: its --ttl "
        "deadline passed during your command"
    ) in " ".join(ended.stderr.split())
    assert "Its key and state are removed." in " ".join(ended.stderr.split())
    # The summary above that error does not say the opposite.
    assert "still up" not in ended.stdout + ended.stderr
    assert "ended: its node is gone" in ended.stdout + ended.stderr
    assert not session_dir("short").exists()
    row = Journal().get(str(state["run_id"]))
    assert row is not None
    assert row.teardown == "confirmed"
    assert "deadline passed" in (row.detail or "")
    assert served.node_names(PROJECT) == []
    record = json.loads((tmp_path / "ended" / "run.json").read_text())
    assert record["ok"] is False
    assert "--ttl deadline passed" in record["failure"]


def session_file(name: str) -> Path:
    return session_dir(name) / "session.json"


def _age_session(name: str, by: float, *, idle_too: bool = False) -> None:
    """Move the session's recorded times on this machine `by` seconds back (its --ttl
    length unchanged), as if it had been up that much longer; with `idle_too`, its last
    renewal as well (nothing renewed it meanwhile)."""
    path = session_file(name)
    state = json.loads(path.read_text())
    keys = ("started_at", "deadline_at", *(("renewed_at",) if idle_too else ()))
    for key in keys:
        state[key] = float(state[key]) - by
    path.write_text(json.dumps(state))


def test_bad_input_is_refused_before_anything_is_sent(served: Emulator, tmp_path: Path) -> None:
    # The refusals run in this process (`invoke`): each is a validation before any call,
    # and a `tpulab` subprocess per case cost a CLI start-up each (~3 s on a loaded
    # runner). The session they name, and the dry runs, are real.
    status, _, err = invoke("exec", "--", "true")
    assert status == EXIT_CONFIG
    assert "No session is up" in err
    assert served.requests() == []

    state = up(served, "gate")
    work = tmp_path / "work"
    work.mkdir()
    (work / "big.bin").write_bytes(b"x" * 4096)
    sent = len(served.requests())
    capped_out = tmp_path / "capped"
    loop = tmp_path / "loop-a"
    loop.symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(loop)
    capped = ("--workdir", str(work), "--max-upload", "1K", "--out", str(capped_out))
    refused = {
        ("nosuch", "--", "true"): "There is no session named 'nosuch'",
        ("Not_A_Name", "--", "true"): "Session name 'Not_A_Name' is not valid",
        ("gate",): "tpulab exec needs a command after --",
        ("gate", "--env", "TPULAB_RUN_ID=x", "--", "true"): "is set by tpulab itself",
        ("gate", "--max-upload", "0", "--", "true"): "Invalid --max-upload '0'",
        ("gate", "--workdir", str(tmp_path / "nowhere"), "--", "true"): "does not exist",
        ("gate", *capped, "--", "true"): "over the 1.0 KiB cap",
        # Issue 20 #2, #5, #13: every path flag proven usable, the launch line bounded.
        ("gate", "--out", str(work / "big.bin" / "out"), "--", "true"): (
            "big.bin is not a directory"
        ),
        ("gate", "--workdir", str(loop), "--", "true"): "--workdir",
        ("gate", "--out", str(loop), "--", "true"): "--out",
        ("gate", "--requirements", str(loop), "--", "true"): "--requirements",
        ("gate", "--workdir", str(work), "--", "echo", "x" * 131_000): "over the 98,304-byte",
    }
    for args, said in refused.items():
        status, _, err = invoke("exec", *args)
        assert status == EXIT_CONFIG, (args, err)
        assert said in " ".join(err.split()), (args, err)
        if str(loop) in args:
            assert "goes through a symbolic link loop" in " ".join(err.split())
    assert not capped_out.exists()  # refused in validation: not even a run.json

    # The dry run is the exec's own Lifecycle over recording seams: no create, no
    # bootstrap, no verifier, no delete; the lease renewal, sync, command and fetch.
    where = ("--workdir", str(LAB))
    plan = tpulab("exec", "gate", *where, "--dry-run", "--json", "--", "python", "train.py")
    assert plan.returncode == EXIT_OK, plan.stderr
    steps = json.loads(plan.stdout)["steps"]
    assert json.loads(plan.stdout)["command"] == "exec"
    rpcs = [step["action"] for step in steps if step["kind"] == "api"]
    assert "CreateNode" not in rpcs
    assert "DeleteNode" not in rpcs
    phases = [step["phase"] for step in steps]
    assert "bootstrap" not in phases
    assert "verify" not in phases
    assert [p for p in ("connect", "sync", "workload", "fetch") if p in phases] == [
        "connect", "sync", "workload", "fetch",
    ]  # fmt: skip
    commands = [step.get("command") or "" for step in steps]
    assert any("tpulab-lease" in line for line in commands)  # the lease renewed first
    assert any("train.py" in line for line in commands)
    human = tpulab("exec", "gate", *where, "--dry-run", "--", "python", "train.py")
    assert human.returncode == EXIT_OK, human.stderr
    assert "Plan for exec" in human.stdout
    assert "on session gate" in human.stdout

    # A session whose --ttl deadline passed is refused too (its node is gone or going).
    path = session_dir("gate") / "session.json"
    expired = {**json.loads(path.read_text()), "deadline_at": time.time() - 1}
    path.write_text(json.dumps(expired))
    status, _, err = invoke("exec", "gate", "--", "true")
    assert status == EXIT_CONFIG
    assert "Session gate has expired" in err
    assert len(served.requests()) == sent
    down = tpulab("down", "gate", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []
    assert state["node_name"] not in served.node_names(PROJECT)


def test_exec_help_and_dry_run_stay_light(tmp_path: Path) -> None:
    import base64

    from tpulab.cleanup.sessions import SessionStore
    from tpulab.remote.keys import RunKey
    from tpulab.run.session_state import SessionState

    # A session as `up` leaves it on disk (the dry run reads its state, never its key).
    key = RunKey()
    store = SessionStore()
    store.reserve("light", key.openssh_private_bytes())
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(32)
    now = time.time()
    store.save(
        SessionState(
            name="light", run_id="20261201t000000-abcdef", node_name="tpulab-light",
            zone=ZONE, project=PROJECT, api_endpoint="http://127.0.0.1:9",
            accelerator_type="v5litepod-4", spot=False, ssh_user="tpulab",
            ssh_host="127.0.0.1", ssh_port=2222, host_key_type="ssh-ed25519",
            host_key_b64=base64.b64encode(blob).decode(),
            watchdog={
                "run_id": "20261201t000000-abcdef", "node_name": "tpulab-light", "zone": ZONE,
                "project": PROJECT, "lease_seconds": 600.0, "boot_grace_seconds": 600.0,
                "max_duration_seconds": 3600.0,
            },
            started_at=now, deadline_at=now + 3600, idle_seconds=600.0, renewed_at=now,
            receipt_id="r-light",
        )
    )  # fmt: skip
    for argv in (
        ["exec", "--help"],
        ["exec", "light", "--workdir", str(LAB), "--dry-run", "--", "python", "train.py"],
    ):
        done = cli_imports(*argv)
        assert done.code in (0, None), done.stderr + done.stdout
        assert done.heavy == [], f"`tpulab {' '.join(argv)}` imported {done.heavy}"
    assert "receipt r-light" in done.stdout  # the gate the plan names


def test_the_launcher_starts_each_command_with_an_empty_run_dir(tmp_path: Path) -> None:
    # Successive execs on one VM share the run dir and log: the launcher itself (run
    # here, as the VM runs it) must clear them, or a fetch brings back old files.
    launcher = Path(__file__).resolve().parent.parent / "remote_payloads" / "workload_launcher.py"
    layout = {name: tmp_path / "run" / name for name in ("out", "output.log", "pid", "status")}

    def launch(name: str) -> None:
        script = (
            "import os, pathlib, sys; "
            "pathlib.Path(os.environ['TPULAB_RUN_DIR'], sys.argv[1]).write_text('x'); "
            "print('wrote', sys.argv[1])"
        )
        subprocess.run(
            [
                sys.executable, str(launcher), "--workspace", str(tmp_path),
                "--run-dir", str(layout["out"]), "--log", str(layout["output.log"]),
                "--pid-file", str(layout["pid"]), "--status", str(layout["status"]),
                "--venv", str(tmp_path / "venv"), "--timeout", "60", "--",
                sys.executable, "-c", script, name,
            ],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip

    launch("first")
    launch("second")
    assert sorted(p.name for p in layout["out"].iterdir()) == ["second"]
    assert layout["output.log"].read_text() == "wrote second\n"


def test_a_session_file_from_before_receipt_ids_still_loads() -> None:
    from tpulab.run.session_state import SessionState

    older: dict[str, object] = {
        "name": "old", "run_id": "20261201t000000-abcdef", "node_name": "tpulab-old",
        "zone": ZONE, "project": PROJECT, "api_endpoint": None, "accelerator_type": "v5litepod-4",
        "spot": False, "ssh_user": "tpulab", "ssh_host": "10.0.0.2", "ssh_port": 22,
        "host_key_type": "ssh-ed25519", "host_key_b64": "AAAA", "watchdog": {},
        "started_at": 1.0, "deadline_at": 2.0, "idle_seconds": 1.0, "renewed_at": 1.0,
    }  # fmt: skip
    state = SessionState.from_json(json.dumps(older))
    assert state.receipt_id is None
    assert json.loads(state.to_json())["receipt_id"] is None


def test_exec_on_a_session_whose_idle_lease_lapsed_says_so_and_cleans_up(
    served: Emulator, tmp_path: Path
) -> None:
    state = up(served, "lapsed", "--idle", "30s")
    # Nobody renews: the VM's watchdog deletes the node once --idle (or, before the first
    # renewal, its boot grace) passes. Aged rather than waited for: the session's times
    # here and the VM's clock move forward by as much, past both, well before --ttl.
    watchdog = state["watchdog"]
    assert isinstance(watchdog, dict)
    idle = max(float(watchdog["lease_seconds"]), float(watchdog["boot_grace_seconds"]))
    by = idle + (time.time() - float(str(state["started_at"]))) + 1
    assert by < float(str(state["deadline_at"])) - time.time(), "the --ttl would pass first"
    _age_session("lapsed", by, idle_too=True)
    # Once its watchdog has read up's last renewal (read after the move, it would be
    # dated after it and the lease would lapse a real --idle later).
    node = str(state["node_name"])
    wait_until(lambda: watchdog_saw_the_last_renewal(served, node), "up's last renewal read")
    served.skip_vm_clock(PROJECT, ZONE, node, by)
    wait_until(lambda: not served.node_names(PROJECT), "the idle session's node to go", 120)
    out = ("--out", str(tmp_path / "out"))
    done = tpulab("exec", "lapsed", "--workdir", str(LAB), *out, "--", "true", timeout=300)
    assert done.returncode == EXIT_REMOTE, done.stderr + done.stdout
    said = " ".join(done.stderr.split())
    assert f"Session lapsed's node {state['node_name']}" in said
    assert "idle for 30 s (--idle)" in said
    assert "Its key and state are removed." in said
    assert not session_dir("lapsed").exists()
    row = Journal().get(str(state["run_id"]))
    assert row is not None
    assert row.teardown == "confirmed"
