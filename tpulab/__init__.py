"""tpulab: run a JAX experiment on a Cloud TPU VM, prove it ran there, leave nothing billing."""

__version__ = "0.1.0"
