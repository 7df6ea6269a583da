"""The run log's schema: its migrations, the views for common questions, and how paths are stored.

`docs/runlog.md` documents the tables and views column by column. Every migration runs inside the
write transaction of the process that opens an older log, so a log is carried forward exactly once.
Paths inside the workspace are stored relative to it (the folder that holds the log), so a copied or
moved workspace still finds its run folders, logs and checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adaflash.sqlite_db import sqlite_utils

Migration = Callable[..., None]

# Columns that hold a path; inside the workspace it is stored relative to it.
PATH_COLUMNS = {"runs": ("run_dir",), "jobs": ("log_path",), "checkpoints": ("path",)}
# Rows the inference worker writes per drafter version it served (their `version` is that drafter version).
SERVED_METRICS = ("served_requests", "served_tau_sum", "served_tokens", "served_verify")


def _migration_1(db: sqlite_utils.Database, root: Path | None = None) -> None:
    db["runs"].create(
        {
            "id": str, "kind": str, "name": str, "method": str, "target": str, "draft": str,
            "dataset": str, "status": str, "created_at": float, "ended_at": float,
            "config": str, "run_dir": str, "pid": int, "host": str, "note": str,
        },
        pk="id",
    )
    db["runs"].create_index(["created_at"])
    db["jobs"].create(
        {
            "id": int, "run_id": str, "name": str, "role": str, "command": str, "gpus": str,
            "pid": int, "pgid": int, "pid_start_time": float, "status": str, "exit_code": int,
            "log_path": str, "started_at": float, "ended_at": float, "restarts": int, "message": str,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db["jobs"].create_index(["run_id"])
    db["metrics"].create(
        {"id": int, "run_id": str, "job": str, "step": int, "name": str, "value": float, "time": float},
        pk="id",
    )
    db["metrics"].create_index(["run_id", "id"])
    db["metrics"].create_index(["run_id", "name", "id"])
    db["events"].create(
        {"id": int, "run_id": str, "job": str, "level": str, "message": str, "time": float}, pk="id"
    )
    db["events"].create_index(["run_id", "id"])
    db["bench_results"].create(
        {
            "id": int, "run_id": str, "label": str, "method": str, "target": str, "draft": str,
            "dataset": str, "concurrency": int, "num_prompts": int, "output_throughput": float,
            "accept_length": float, "accuracy": float, "data": str, "time": float,
        },
        pk="id",
    )
    db["bench_results"].create_index(["run_id"])
    db["checkpoints"].create(
        {
            "id": int, "run_id": str, "kind": str, "path": str, "version": int, "step": int,
            "metrics": str, "time": float,
        },
        pk="id",
    )
    db["checkpoints"].create_index(["run_id"])


def _migration_2(db: sqlite_utils.Database, root: Path | None = None) -> None:
    """The create time of a run's process, so a reader can tell it from a later process with the same pid."""
    db["runs"].add_column("pid_start_time", float)


def _migration_3(db: sqlite_utils.Database, root: Path | None = None) -> None:
    """The identity of an imported result, so importing the same file twice adds nothing."""
    db["bench_results"].add_column("content_hash", str)
    db.execute("CREATE UNIQUE INDEX idx_bench_results_content_hash ON bench_results (content_hash) "
               "WHERE content_hash IS NOT NULL")


# The tables migration 4 rebuilds, as they are from then on: every run_id declares its foreign key.
TABLES_4 = {
    "metrics": (
        'CREATE TABLE "{name}" ("id" INTEGER PRIMARY KEY, "run_id" TEXT REFERENCES "runs"("id"), "job" TEXT, '
        '"step" INTEGER, "version" INTEGER, "name" TEXT, "value" REAL, "time" REAL)',
        ['CREATE INDEX "idx_metrics_run_id_id" ON "metrics" ("run_id", "id")',
         'CREATE INDEX "idx_metrics_run_id_name_id" ON "metrics" ("run_id", "name", "id")'],
    ),
    "events": (
        'CREATE TABLE "{name}" ("id" INTEGER PRIMARY KEY, "run_id" TEXT REFERENCES "runs"("id"), "job" TEXT, '
        '"level" TEXT, "message" TEXT, "time" REAL)',
        ['CREATE INDEX "idx_events_run_id_id" ON "events" ("run_id", "id")'],
    ),
    "bench_results": (
        'CREATE TABLE "{name}" ("id" INTEGER PRIMARY KEY, "run_id" TEXT REFERENCES "runs"("id"), "label" TEXT, '
        '"method" TEXT, "target" TEXT, "draft" TEXT, "dataset" TEXT, "concurrency" INTEGER, "num_prompts" INTEGER, '
        '"output_throughput" REAL, "accept_length" REAL, "accuracy" REAL, "data" TEXT, "time" REAL, '
        '"content_hash" TEXT)',
        ['CREATE INDEX "idx_bench_results_run_id" ON "bench_results" ("run_id")',
         'CREATE UNIQUE INDEX "idx_bench_results_content_hash" ON "bench_results" ("content_hash") '
         'WHERE "content_hash" IS NOT NULL'],
    ),
    "checkpoints": (
        'CREATE TABLE "{name}" ("id" INTEGER PRIMARY KEY, "run_id" TEXT REFERENCES "runs"("id"), "kind" TEXT, '
        '"path" TEXT, "version" INTEGER, "step" INTEGER, "metrics" TEXT, "time" REAL)',
        ['CREATE INDEX "idx_checkpoints_run_id" ON "checkpoints" ("run_id")'],
    ),
}


def _rebuild(db: sqlite_utils.Database, table: str, select: str) -> None:
    """Replace `table` by its TABLES_4 form, filled by `select` (which reads the old table as `old`)."""
    ddl, indexes = TABLES_4[table]
    db.execute(ddl.format(name=f"{table}_new"))
    db.execute(f'INSERT INTO "{table}_new" {select.format(old=table)}')
    db.execute(f'DROP TABLE "{table}"')
    db.execute(f'ALTER TABLE "{table}_new" RENAME TO "{table}"')
    for sql in indexes:
        db.execute(sql)


def _migration_4(db: sqlite_utils.Database, root: Path | None = None) -> None:
    """Foreign keys on every run_id; metrics.version apart from metrics.step; runs.parent_id/parent_job; paths
    inside the workspace stored relative to it.

    Before, `metrics.step` held the drafter version for the served_* rows and a count (samples, training
    steps) for every other row; the drafter version a flush measured was only a `drafter_version` row
    written at the same time. Now `step` is always a count and `version` the drafter version. Child runs
    were tied to their parent only by the pid of the job that created them, or a bench matrix's cells by
    `config.matrix_run`: both become `parent_id`."""
    served = ", ".join(f"'{n}'" for n in SERVED_METRICS)
    db.execute("CREATE TEMP TABLE _versions AS SELECT run_id, job, time, CAST(MAX(value) AS INTEGER) AS version "
               "FROM metrics WHERE name IN ('drafter_version', 'published_version') GROUP BY run_id, job, time")
    db.execute("CREATE INDEX temp._versions_key ON _versions (run_id, job, time)")
    _rebuild(db, "metrics", (
        "(id, run_id, job, step, version, name, value, time) "
        f"SELECT o.id, o.run_id, o.job, CASE WHEN o.name IN ({served}) THEN NULL ELSE o.step END, "
        f"CASE WHEN o.name IN ({served}) THEN o.step WHEN o.name = 'swapped_version' THEN CAST(o.value AS INTEGER) "
        "ELSE v.version END, o.name, o.value, o.time "
        'FROM "{old}" o LEFT JOIN _versions v ON v.run_id = o.run_id AND v.job = o.job AND v.time = o.time'))
    db.execute("DROP TABLE _versions")
    _rebuild(db, "events", 'SELECT id, run_id, job, level, message, time FROM "{old}"')
    _rebuild(db, "bench_results", 'SELECT id, run_id, label, method, target, draft, dataset, concurrency, '
                                  'num_prompts, output_throughput, accept_length, accuracy, data, time, content_hash '
                                  'FROM "{old}"')
    _rebuild(db, "checkpoints", 'SELECT id, run_id, kind, path, version, step, metrics, time FROM "{old}"')

    db.execute('ALTER TABLE "runs" ADD COLUMN "parent_id" TEXT REFERENCES "runs"("id")')
    db.execute('ALTER TABLE "runs" ADD COLUMN "parent_job" TEXT')
    db.execute('CREATE INDEX "idx_runs_parent_id" ON "runs" ("parent_id")')
    db.execute("UPDATE runs SET parent_id = json_extract(config, '$.matrix_run') WHERE parent_id IS NULL "
               "AND json_valid(config) AND json_extract(config, '$.matrix_run') IN (SELECT id FROM runs)")
    db.execute(
        "UPDATE runs SET (parent_id, parent_job) = (SELECT j.run_id, j.name FROM jobs j JOIN runs p ON p.id = j.run_id "
        "WHERE j.pid = runs.pid AND p.host IS runs.host AND p.id != runs.id AND j.started_at IS NOT NULL "
        "AND runs.created_at >= j.started_at - 1 AND (j.ended_at IS NULL OR runs.created_at <= j.ended_at) "
        "ORDER BY j.started_at DESC LIMIT 1) WHERE parent_id IS NULL AND pid IS NOT NULL")

    if root is not None:
        for table, columns in PATH_COLUMNS.items():
            pk = "id"
            for column in columns:
                for pk_value, value in db.execute(f'SELECT {pk}, "{column}" FROM "{table}" '
                                                  f'WHERE "{column}" IS NOT NULL').fetchall():
                    stored = store_path(value, root)
                    if stored != value:
                        db.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE {pk} = ?', [stored, pk_value])


MIGRATIONS: list[Migration] = [_migration_1, _migration_2, _migration_3, _migration_4]

# -- views --------------------------------------------------------------------------------------------
VIEWS = {
    # One row per benchmark result with the Vanilla row it is compared with, as `adaflash runs compare` pairs
    # them: the same bench matrix (or, outside any matrix, the standalone results), target, dataset and
    # concurrency; the newest such Vanilla row.
    "bench_speedup": """
        WITH r AS (
            SELECT b.*, json_extract(b.data, '$.matrix_run') AS matrix_run,
                   COALESCE(json_extract(b.data, '$.matrix_run'), 'standalone') AS grp
            FROM bench_results b WHERE json_valid(b.data)
        )
        SELECT r.id AS result_id, r.run_id, r.matrix_run, r.grp AS "group", r.method, r.target, r.draft,
               r.dataset, r.concurrency, r.label, r.num_prompts, r.output_throughput, r.accept_length,
               r.accuracy, v.id AS vanilla_result_id, v.output_throughput AS vanilla_throughput,
               r.output_throughput / NULLIF(v.output_throughput, 0) AS speedup
        FROM r LEFT JOIN r AS v ON v.id = (
            SELECT MAX(x.id) FROM r AS x WHERE x.method = 'vanilla' AND x.grp = r.grp AND x.target IS r.target
            AND x.dataset IS r.dataset AND x.concurrency IS r.concurrency)
    """,
    # τ per drafter version of a pipeline run: mean over the requests that version finished, and the
    # token-weighted τ (tokens / verify steps).
    "tau_per_version": f"""
        SELECT run_id, version AS drafter_version,
               CAST(SUM(CASE WHEN name = 'served_requests' THEN value END) AS INTEGER) AS requests,
               SUM(CASE WHEN name = 'served_tau_sum' THEN value END)
                   / NULLIF(SUM(CASE WHEN name = 'served_requests' THEN value END), 0) AS tau,
               SUM(CASE WHEN name = 'served_tokens' THEN value END)
                   / NULLIF(SUM(CASE WHEN name = 'served_verify' THEN value END), 0) AS tau_tokens,
               CAST(SUM(CASE WHEN name = 'served_tokens' THEN value END) AS INTEGER) AS output_tokens
        FROM metrics
        WHERE version IS NOT NULL AND name IN ({", ".join(f"'{n}'" for n in SERVED_METRICS)})
        GROUP BY run_id, version
    """,
    # Every run under every run (itself included, depth 0): `WHERE root_id = ?` gives one run's tree.
    "run_tree": """
        WITH RECURSIVE tree (root_id, run_id, depth, path) AS (
            SELECT id, id, 0, id FROM runs
            UNION ALL
            SELECT tree.root_id, runs.id, tree.depth + 1, tree.path || ' > ' || runs.id
            FROM runs JOIN tree ON runs.parent_id = tree.run_id WHERE tree.depth < 32
        )
        SELECT tree.root_id, tree.depth, tree.path, runs.id AS run_id, runs.parent_id, runs.parent_job, runs.kind,
               runs.name, runs.method, runs.target, runs.dataset, runs.status, runs.created_at, runs.ended_at
        FROM tree JOIN runs ON runs.id = tree.run_id
    """,
}


def create_views(db: sqlite_utils.Database) -> None:
    """Drop every view and create those of VIEWS (after any migration: a view may read a changed table)."""
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall():
        db.execute(f'DROP VIEW "{name}"')
    for name, sql in VIEWS.items():
        db.execute(f'CREATE VIEW "{name}" AS {sql.strip()}')


def apply_migrations(db: sqlite_utils.Database, root: Path | None = None) -> None:
    """Every migration the log lacks, inside the caller's write transaction (the version is read again here:
    another process may have migrated meanwhile); then the views."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version >= len(MIGRATIONS):
        return
    for view in db.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall():
        db.execute(f'DROP VIEW "{view[0]}"')  # a table rebuild may not rename under a view that reads it
    for index in range(version, len(MIGRATIONS)):
        MIGRATIONS[index](db, root)
    create_views(db)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")


# -- paths --------------------------------------------------------------------------------------------
def _roots(root: Path) -> list[str]:
    found = [os.path.abspath(root)]
    real = os.path.realpath(root)
    return found if real in found else [*found, real]


def store_path(value: Any, root: Path) -> Any:
    """A path as stored: relative to the workspace when inside it (`.` for the workspace itself)."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        return value
    path = os.path.abspath(os.path.expanduser(str(value)))
    for base in _roots(root):
        if path == base:
            return "."
        if path.startswith(base.rstrip(os.sep) + os.sep):
            return os.path.relpath(path, base)
    return str(value) if os.path.isabs(str(value)) else path


def load_path(value: Any, root: Path) -> Any:
    """A stored path as callers use it: absolute, a relative one read from the workspace."""
    if not isinstance(value, str) or not value or os.path.isabs(value):
        return value
    return os.path.normpath(os.path.join(os.path.abspath(root), value))


def load_paths(row: dict[str, Any], table: str, root: Path) -> dict[str, Any]:
    for column in PATH_COLUMNS.get(table, ()):
        if column in row:
            row[column] = load_path(row[column], root)
    return row
