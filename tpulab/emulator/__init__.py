"""The offline Cloud TPU API: an HTTP server wire-compatible with tpu.googleapis.com/v2,
whose READY nodes are backed by real SSH servers on loopback."""
