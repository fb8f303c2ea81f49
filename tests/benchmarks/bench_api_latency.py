"""A request on a kept-alive connection to the emulator against one on a new connection.

tpulab's clients (google-cloud-tpu's REST transport, Compute's `requests` session) keep
their connection alive, as they do to Google. The emulator once answered those ~40 ms
late: it writes a response's headers and body in two sends, and with Nagle's algorithm
on, the body waited for the client's delayed ACK of the headers (measured on a quiet
2-core machine, median of 40 GetNode: kept-alive 48.1 ms against 3.5 ms on a new
connection, 0.07x; with TCP_NODELAY, 1.9 ms against 4.8 ms, 2.57x). Every poll of every
emulated run paid it, and `tpulab list`'s lease reads paid it once per node.
The baseline is the same request on a fresh connection each time, which no Nagle stall
can reach (nothing is unacknowledged when the body goes). Goal: the kept-alive request
at least 0.8x as fast (a fresh connection's extra handshake makes it slower, not
faster). Run: `nox -s bench` or `pytest tests/benchmarks/bench_api_latency.py -s`.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import requests

from benchmarks.smoke import goal, rounds
from tpulab.emulator import Emulator, Timing
from tpulab.models import NodeRequest

PROJECT = "bench-project"
ZONE = "us-central1-a"
REQUESTS = rounds(40)


def _median_ms(get: requests.Session | None, url: str) -> float:
    times = []
    for _ in range(REQUESTS):
        started = time.perf_counter()
        answer = (get or requests).get(url, timeout=30)
        times.append(time.perf_counter() - started)
        assert answer.status_code == 200, answer.text  # the same work every time
    return statistics.median(times) * 1000


def test_a_kept_alive_request_is_not_slower_than_a_new_connection(tmp_path: Path) -> None:
    from tpulab.cloud.google import GoogleTpuApi

    timing = Timing(create_seconds=0.0, delete_seconds=0.0)
    with Emulator(tmp_path / "state", timing=timing) as emulator:
        api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
        runtime = "v2-alpha-tpuv5-lite"
        api.create_node(
            ZONE, "latency", NodeRequest(accelerator_type="v5litepod-4", runtime_version=runtime)
        )
        url = f"{emulator.url}/v2/projects/{PROJECT}/locations/{ZONE}/nodes/latency"
        with requests.Session() as session:
            session.get(url, timeout=30)  # open the connection the timed ones reuse
            kept = _median_ms(session, url)
        fresh = _median_ms(None, url)
    ratio = fresh / kept
    print(
        f"\n[bench_api_latency] median of {REQUESTS} GetNode: kept-alive {kept:.1f} ms, "
        f"new connection {fresh:.1f} ms, ratio {ratio:.2f}x (goal >= 0.8x)"
    )
    goal(ratio >= 0.8, f"a kept-alive request took {kept:.1f} ms against {fresh:.1f} ms")
