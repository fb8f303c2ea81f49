"""The run journal's SQLite schema, and the steps that bring an older journal to it.

`tpulab.cleanup.journal` asks `statements_from(version)` inside one write transaction, so a
journal is created, or migrated from any older tpulab's, all at once or not at all: an
older journal's open rows are nodes that may still bill, and must stay findable.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["SCHEMA_VERSION", "statements_from"]

SCHEMA_VERSION = 7

_SCHEMA = """
CREATE TABLE runs (
    run_id      TEXT PRIMARY KEY,
    project     TEXT NOT NULL,
    zone        TEXT NOT NULL,
    node_name   TEXT NOT NULL,
    accelerator TEXT NOT NULL,
    target      TEXT NOT NULL,
    emulated    INTEGER NOT NULL,
    spot        INTEGER NOT NULL DEFAULT 0,
    started     TEXT NOT NULL,
    updated     TEXT NOT NULL,
    phase       TEXT NOT NULL,
    pid         INTEGER,
    host        TEXT,
    proc_start  TEXT,
    ended       TEXT,
    teardown    TEXT CHECK (teardown IN ('confirmed', 'unconfirmed', 'not-created', 'forgotten')),
    detail      TEXT NOT NULL DEFAULT '',
    queued_resource TEXT,
    run_record  TEXT,  -- schema 4's pointer, moved to `records` by schema 5: unused
    provider    TEXT NOT NULL DEFAULT 'tpu-api'
);
CREATE INDEX runs_by_teardown ON runs (teardown);
CREATE INDEX runs_by_node ON runs (project, zone, node_name);
CREATE TABLE records (
    run_id      TEXT PRIMARY KEY,
    path        TEXT NOT NULL,
    session_run_id TEXT,
    written     TEXT NOT NULL,
    pid         INTEGER,
    host        TEXT,
    proc_start  TEXT
);
"""

# Each step takes a journal of the version before it one version up (the key). Steps are
# history: frozen literals, never derived from _SCHEMA (which moves on).
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # Schema 2 records the queued resource a `--queued` run asked for its node through.
    1: ("ALTER TABLE runs ADD COLUMN queued_resource TEXT",),
    # Schema 3 lets `teardown --forget` close a row as "forgotten". SQLite cannot alter a
    # CHECK constraint, so the table is rebuilt (same columns, same order) and its
    # indexes, dropped with it, are made again.
    2: (
        """CREATE TABLE runs_v3 (
    run_id      TEXT PRIMARY KEY,
    project     TEXT NOT NULL,
    zone        TEXT NOT NULL,
    node_name   TEXT NOT NULL,
    accelerator TEXT NOT NULL,
    target      TEXT NOT NULL,
    emulated    INTEGER NOT NULL,
    spot        INTEGER NOT NULL DEFAULT 0,
    started     TEXT NOT NULL,
    updated     TEXT NOT NULL,
    phase       TEXT NOT NULL,
    pid         INTEGER,
    host        TEXT,
    proc_start  TEXT,
    ended       TEXT,
    teardown    TEXT CHECK (teardown IN ('confirmed', 'unconfirmed', 'not-created', 'forgotten')),
    detail      TEXT NOT NULL DEFAULT '',
    queued_resource TEXT
)""",
        "INSERT INTO runs_v3 SELECT * FROM runs",
        "DROP TABLE runs",
        "ALTER TABLE runs_v3 RENAME TO runs",
        "CREATE INDEX runs_by_teardown ON runs (teardown)",
        "CREATE INDEX runs_by_node ON runs (project, zone, node_name)",
    ),
    # Schema 4 points a row at its run's record (<out>/run.json of a `-- CMD` run), which
    # is how `tpulab runs` finds them.
    3: ("ALTER TABLE runs ADD COLUMN run_record TEXT",),
    # Schema 5 moves those pointers to a table of their own: a session's `tpulab exec`
    # writes a record too, but it creates no node, so it has no row in `runs` (whose rows
    # are what costs bills and teardown sweeps). The column stays, unused: dropping one
    # needs SQLite 3.35, newer than some laptops' Python ships.
    4: (
        """CREATE TABLE records (
    run_id      TEXT PRIMARY KEY,
    path        TEXT NOT NULL,
    session_run_id TEXT,
    written     TEXT NOT NULL
)""",
        "INSERT INTO records (run_id, path, session_run_id, written) "
        "SELECT run_id, run_record, NULL, started FROM runs WHERE run_record IS NOT NULL",
    ),
    # Schema 6 stamps each pointer with the process that writes the record (pid, host,
    # start time, as a run's row has them), which is how `tpulab runs` tells a record
    # still being written from one whose run was SIGKILLed: an exec has no row in `runs`
    # to ask. Older pointers have none; their records were written at the end anyway.
    5: (
        "ALTER TABLE records ADD COLUMN pid INTEGER",
        "ALTER TABLE records ADD COLUMN host TEXT",
        "ALTER TABLE records ADD COLUMN proc_start TEXT",
    ),
    # Schema 7 records which API holds the node: "tpu-api" (a Cloud TPU API node) or
    # "compute" (a Compute Engine instance). Each API answers NOT_FOUND for the other's
    # resources, so a row checked through the wrong one would read as gone while its VM
    # bills. Every older row was a Cloud TPU API node.
    6: ("ALTER TABLE runs ADD COLUMN provider TEXT NOT NULL DEFAULT 'tpu-api'",),
}


def statements_from(version: int) -> Iterator[str]:
    """The statements that take a journal of schema `version` (0: an empty file) to
    SCHEMA_VERSION; the caller runs them in one transaction and sets user_version."""
    if version == 0:
        yield from (statement for statement in _SCHEMA.split(";") if statement.strip())
        return
    for step in range(version, SCHEMA_VERSION):
        yield from _MIGRATIONS[step]
