"""One program across every worker of a slice: each process adds its devices' numbers and
`psum` totals them over the whole slice, so every worker prints the same global sum.

    tpulab run --accelerator v5litepod-16 --emulate --workdir examples/slice_lab \
        --fetch 'psum-*.json' -- python psum.py

tpulab starts this same argv on every worker with TPULAB_WORKER_ID, TPULAB_NUM_WORKERS and
JAX_COORDINATOR_ADDRESS (worker 0) set. On a real TPU VM `jax.distributed.initialize()`
finds all three itself (from the VM's metadata); passing them explicitly works there too
and is what an emulated (CPU) slice needs, so the script does that. A single host
(no TPULAB_NUM_WORKERS) skips the initialize.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp


def main() -> int:
    workers = int(os.environ.get("TPULAB_NUM_WORKERS", "1"))
    worker = int(os.environ.get("TPULAB_WORKER_ID", "0"))
    if workers > 1:
        jax.distributed.initialize(num_processes=workers, process_id=worker)
    devices = jax.devices()
    local = jax.local_devices()
    # Each local device holds its global position + 1: the slice-wide total is the sum
    # 1 + 2 + ... + N over all N devices, whichever worker prints it.
    values = jnp.array([devices.index(d) + 1.0 for d in local])
    total = jax.pmap(lambda x: jax.lax.psum(x, "all"), axis_name="all")(values)
    n = len(devices)
    result = {
        "worker": worker,
        "workers": jax.process_count(),
        "devices": n,
        "local_devices": len(local),
        "psum": float(total[0]),
        "expected": n * (n + 1) / 2,
    }
    print(json.dumps(result), flush=True)
    run_dir = Path(os.environ.get("TPULAB_RUN_DIR", "."))
    (run_dir / f"psum-{worker}.json").write_text(json.dumps(result) + "\n")
    return 0 if result["psum"] == result["expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
