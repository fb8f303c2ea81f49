"""Every worker of an emulated slice compiles the same program, as on a real slice.

A real slice's workers share one HOME path (/home/<user>), so a script staged under
~/jax-tpu-lab has the same absolute path on each of them; an emulated worker's HOME is
its own directory. jax writes the calling script's path into every program it compiles,
and jaxlib 0.12.1 stalls a cross-process CPU psum whose programs differ only in those
paths (every gloo rank connects; the all-reduce never completes). The emulator tells
jax to drop each worker's own HOME and /tmp prefix (workers.py `same_paths_env`).

Checked here with jax itself, through each worker's real SSH session: the same script,
staged in each worker's HOME and in its /tmp, lowers to the same program text on all
four workers; with the emulator's setting cleared it does not (so the paths do reach
the program, and the equality is the setting's doing).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from test_emulator_slices import WORKERS, ZONE, slice_request, targets

from tpulab.remote.ssh import Connection, RunKey

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator.hosts import HostBackend

pytest_plugins = ["emulator_fixtures", "ssh_fixtures"]

WAIT = 60.0
DIRECTORIES = ("$HOME/jax-tpu-lab", "$TPULAB_EMULATED_TMP")

# Staged twice on each worker, in its HOME and in its /tmp, and run from HOME with the
# /tmp copy's path: lowers a psum over a named axis, with source locations, from each
# copy, as the worker's environment sets jax up and then with the path setting cleared.
# Prints, per copy, the program's sha256 with the setting and without it, and whether
# the script's name is in the program (debug info on).
LOWER = """\
import hashlib, runpy, sys
import jax, jax.numpy as jnp
def program():
    f = jax.vmap(lambda x: jax.lax.psum(x * 2.0, "i"), axis_name="i")
    return jax.jit(f).lower(jnp.ones(4)).as_text(debug_info=True)
if __name__ == "__main__":
    copies = [program, runpy.run_path(sys.argv[1], run_name="staged")["program"]]
    texts = [copy() for copy in copies]
    jax.config.update("jax_hlo_source_file_canonicalization_regex", None)
    for text, copy in zip(texts, copies):
        raw = copy()
        digest = [hashlib.sha256(t.encode()).hexdigest() for t in (text, raw)]
        print(*digest, "lower.py" in text)
"""


def lower_on(connection: Connection) -> list[list[str]]:
    """[program, program without the setting, named] of the HOME copy, then the /tmp one."""
    stage = " && ".join(
        f"mkdir -p {d} && printf %s {shlex.quote(LOWER)} > {d}/lower.py" for d in DIRECTORIES
    )
    run = f"JAX_PLATFORMS=cpu python3 {DIRECTORIES[0]}/lower.py {DIRECTORIES[1]}/lower.py"
    out = connection.run(f"{stage} && {run}", timeout=WAIT, check=True).stdout
    return [line.split() for line in out.splitlines()]


def test_every_worker_compiles_the_same_program_from_its_own_home_and_tmp(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    api = api_for(emulator)
    key = RunKey()
    api.create_node(ZONE, "sp", slice_request(key))
    workers, _ = targets(api, host_backend, "sp")

    seen: list[list[list[str]]] = []  # per worker, per copy (HOME, /tmp)
    for target in workers:
        with Connection(target, key, connect_timeout=WAIT) as connection:
            seen.append(lower_on(connection))
    api.wait_operation(api.delete_node(ZONE, "sp"), timeout=WAIT)

    assert len(seen) == WORKERS
    for copy, directory in enumerate(DIRECTORIES):
        results = [worker[copy] for worker in seen]
        assert all(named == "True" for _program, _raw, named in results), directory
        programs = {program for program, _raw, _named in results}
        assert len(programs) == 1, f"{directory}: the workers' programs differ"
        raw_programs = {raw for _program, raw, _named in results}
        assert len(raw_programs) == WORKERS, f"{directory}: without the setting, paths differ"
