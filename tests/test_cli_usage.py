"""The CLI's own edges: usage errors under --json, and Ctrl-C at a confirmation prompt."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing
from tpulab.exits import EXIT_CONFIG, EXIT_INTERRUPTED
from tpulab.models import NodeRequest, tpulab_labels

ENV = {**os.environ, "COLUMNS": "200"}


def test_a_usage_error_under_json_is_a_json_envelope_with_status_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", "run", "--json", "--spot"],
        capture_output=True,
        text=True,
        env=ENV,
        check=False,
        timeout=60,
    )
    assert done.returncode == EXIT_CONFIG
    document = json.loads(done.stdout)
    assert document["ok"] is False
    assert document["command"] == "run"
    assert document["error"]["exit_status"] == EXIT_CONFIG
    assert "--accelerator" in document["error"]["message"]


def test_ctrl_c_at_the_delete_prompt_deletes_nothing_and_exits_130(tmp_path: Path) -> None:
    with Emulator(tmp_path / "served", timing=Timing.fast()) as emulator:
        api = GoogleTpuApi("prompt-proj", api_endpoint=emulator.url)
        request = NodeRequest(
            accelerator_type="v5litepod-4",
            runtime_version="v2-alpha-tpuv5-lite",
            labels=tpulab_labels("20261201t000000-abcdef"),
        )
        api.wait_operation(api.create_node("us-central1-a", "tpulab-left", request), timeout=30)
        # The prompt needs a terminal on stdin; the test holds the other end.
        controller, terminal = pty.openpty()
        child = subprocess.Popen(
            [sys.executable, "-m", "tpulab", "teardown", "--verify", "--api-endpoint",
             emulator.url, "--project", "prompt-proj", "--zone", "us-central1-a"],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )  # fmt: skip
        os.close(terminal)
        try:
            assert child.stdout is not None
            seen = ""
            deadline = time.monotonic() + 60
            while "[y/N]" not in seen and time.monotonic() < deadline:
                chunk = os.read(child.stdout.fileno(), 4096).decode()
                if not chunk:
                    break
                seen += chunk
            assert "[y/N]" in seen, seen
            child.send_signal(signal.SIGINT)
            # communicate, not wait: a child blocked writing to a full stderr pipe would
            # otherwise look like one that ignored the Ctrl-C (a CI run once timed out
            # here); if it does time out, what the child said is in the failure.
            try:
                _, stderr = child.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                _, stderr = child.communicate()
                raise AssertionError(f"no exit 60 s after SIGINT at the prompt: {stderr}") from None
            status = child.returncode
        finally:
            os.close(controller)
            if child.poll() is None:
                child.kill()
        assert status == EXIT_INTERRUPTED, stderr
        assert "nothing was changed" in stderr
        assert emulator.node_names() == ["tpulab-left"]
