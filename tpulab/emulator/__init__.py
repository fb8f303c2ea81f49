"""The offline Cloud TPU API: an HTTP server wire-compatible with tpu.googleapis.com/v2,
whose READY nodes are backed by real SSH servers on loopback.

    with Emulator(state_dir, timing=Timing.fast()) as emulator:
        api = GoogleTpuApi("p", api_endpoint=emulator.url)
        emulator.faults.stockout = True    # the next create operation fails with code 8

Importing this package is cheap (stdlib only); SSH backends are imported by whoever
builds them (`tpulab.emulator.backends.make_host_backend`).
"""

from tpulab.emulator.faults import FaultPlan
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing

__all__ = ["Emulator", "FaultPlan", "Timing"]
