"""The application layer: where a target is built and runs, sessions and sweeps are
composed from the core. The CLI (tpulab.cli) and the library facade (`import tpulab`)
both call it, so a library call does exactly what the command does.

- `target`: which Cloud TPU API a command talks to (Google, an endpoint, the embedded
  emulator of `--emulate`): the only place a TPU API client is built.
- `embedded`: the in-process emulator behind `--emulate`.
- `runs`: `tpulab run` -- attempts (zone failover, spot recovery, queued resources) over
  the run engine, inside the signal handling that keeps the teardown.

It never prints and never exits: what to show goes to the callbacks it is given.
"""
