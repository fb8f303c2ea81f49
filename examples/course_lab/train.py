"""A course-style JAX lab: fit a linear regression with gradient descent, on the device
the course expects, and leave checkpoints, metrics and a device receipt in a run dir.

    python train.py --run-dir "$TPULAB_RUN_DIR" --steps 20

numpy + jax only. The platform defaults to $COURSE_EXPECT_PLATFORM (tpulab sets it to the
platform its verifier proved: tpu, or cpu on an emulated node), and the script refuses
to train on anything else: a silent CPU fallback would make every number meaningless.
The batch is sharded over all local devices with pmap, so a 4-chip VM really uses 4.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

FEATURES = 3
TRUE_W = np.array([0.5, -0.25, 1.0], dtype=np.float32)
TRUE_B = np.float32(0.125)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--platform",
        default=os.environ.get("COURSE_EXPECT_PLATFORM", "cpu"),
        help="platform to require (default: $COURSE_EXPECT_PLATFORM, else cpu)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path(os.environ.get("TPULAB_RUN_DIR", "runs/local")),
        help="where checkpoints, metrics.jsonl and device_receipt.json go",
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds, then stop")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    return parser.parse_args(argv)


def device_receipt(platform: str) -> dict[str, object]:
    devices = jax.devices()
    return {
        "requested_platform": platform,
        "observed_platform": devices[0].platform,
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "device_kinds": sorted({d.device_kind for d in devices}),
        "devices": [str(d) for d in devices],
        "process_index": jax.process_index(),
        "jax": jax.__version__,
        "python": sys.version.split()[0],
    }


def make_data(devices: int, per_device: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(devices, per_device, FEATURES)).astype(np.float32)
    y = x @ TRUE_W + TRUE_B
    return x, y.astype(np.float32)


def main(argv: list[str]) -> int:
    args = parse(argv)
    receipt = device_receipt(args.platform)
    run_dir: Path = args.run_dir
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "device_receipt.json").write_text(json.dumps(receipt, indent=2) + "\n")
    if receipt["observed_platform"] != args.platform:
        print(
            f"expected platform {args.platform!r}, JAX gave {receipt['observed_platform']!r}",
            file=sys.stderr,
        )
        return 3
    devices = jax.local_device_count()
    print(f"training on {devices} {args.platform} device(s) for {args.steps} steps", flush=True)

    def loss(params: tuple[jax.Array, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        w, b = params
        return jnp.mean((x @ w + b - y) ** 2)

    def step(params, x, y):  # type: ignore[no-untyped-def]
        value, grads = jax.value_and_grad(loss)(params, x, y)
        grads = jax.lax.pmean(grads, axis_name="d")
        value = jax.lax.pmean(value, axis_name="d")
        new = tuple(p - args.learning_rate * g for p, g in zip(params, grads, strict=False))
        return new, value

    update = jax.pmap(step, axis_name="d")
    x, y = make_data(devices)
    params = (jnp.zeros((devices, FEATURES)), jnp.zeros((devices,)))
    started = time.monotonic()
    with open(run_dir / "metrics.jsonl", "w") as metrics:
        for number in range(1, args.steps + 1):
            params, value = update(params, x, y)
            loss_value = float(value[0])
            metrics.write(json.dumps({"step": number, "loss": round(loss_value, 8)}) + "\n")
            metrics.flush()
            if number % args.checkpoint_every == 0 or number == args.steps:
                w, b = (np.asarray(p[0]) for p in params)
                np.savez(run_dir / "checkpoints" / f"step_{number:05d}.npz", w=w, b=b)
                print(f"step {number}: loss {loss_value:.6f} (checkpoint saved)", flush=True)
            if time.monotonic() - started > args.timeout:
                print(f"stopping at step {number}: --timeout {args.timeout:g} s", flush=True)
                break
    w = np.asarray(params[0][0])
    print(f"done: w={np.round(w, 3).tolist()} b={float(params[1][0]):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
