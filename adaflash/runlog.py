"""The run log: one SQLite file per workspace that every process writes and every reader follows.

Why this shape: many processes (workers, servers, the benchmark client, the TUI) share one file,
so every write is one short IMMEDIATE transaction under WAL with a generous busy timeout, and
readers follow tables incrementally by their integer ids (`*_since(after_id)`), which keeps a
refresh cheap however large the log grows. No torch here: the control plane imports it.
The schema, its migrations and views are in `runlog_schema`; telling a run log from a damaged file
is in `runlog_file`; docs/runlog.md documents the tables.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from adaflash.runlog_file import (  # noqa: F401 - RunLogError and RunLogBusy are this module's API too
    BUSY_CODES,
    DAMAGE_CODES,
    FIRST_WAIT_MS,
    RunLogBusy,
    RunLogError,
    check_file,
    create_file,
    damaged,
    sqlite_code,
)
from adaflash.runlog_schema import (  # noqa: F401 - _migration_1 and MIGRATIONS are this module's API too
    MIGRATIONS,
    PATH_COLUMNS,
    _migration_1,
    apply_migrations,
    load_path,
    load_paths,
    store_path,
)
from adaflash.sqlite_db import sqlite_utils
from adaflash.workspace import runlog_path

RUN_STATUSES = ("pending", "running", "finished", "failed", "stopped", "detached")
JOB_STATUSES = ("pending", "starting", "running", "ready", "finished", "failed", "stopped", "restarting")


LIVE_RUN_STATUSES = ("pending", "running", "detached")
LIVE_JOB_STATUSES = ("pending", "starting", "running", "ready", "restarting")
START_TIME_TOLERANCE = 0.05  # psutil's create times are the same to every reader: this absorbs float rounding


def process_start_time(pid: int | None) -> float | None:
    """Create time of a live (non-zombie) process, or None."""
    import psutil

    if not pid or pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except (psutil.Error, ValueError):
        return None


def _with_start_time(fields: dict[str, Any]) -> None:
    """A pid recorded with its process's create time (unless given), so a reader can tell that process from a
    later one reusing the pid (`runs stop`, lost-run reaping)."""
    if fields.get("pid") and "pid_start_time" not in fields:
        fields["pid_start_time"] = process_start_time(fields["pid"])


def new_run_id(kind: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
    return f"{stamp}-{kind}-{secrets.token_hex(2)}"


def _decode(row: dict[str, Any], json_fields: Iterable[str]) -> dict[str, Any]:
    for key in json_fields:
        if row.get(key):
            with suppress(TypeError, ValueError):
                row[key] = json.loads(row[key])
    return row


RUN_FILTER_COLUMNS = ("kind", "status", "method", "target", "dataset")
RUN_TEXT_COLUMNS = ("id", "name", "kind", "method", "target", "dataset", "status", "note")


class RunLog:
    """Typed access to the run log; safe to use from many processes at once.

    Opening never takes the write lock unless the file needs a migration, so readers are never held up
    by a writer. `check` reads every page once (SQLite's quick_check) so a damaged file is refused up
    front rather than at the first query that reaches the damage: the CLI asks for it. `on_wait` is told
    when a write has to wait for another process's write lock.
    """

    def __init__(self, path: str | os.PathLike, *, timeout: float = 60.0, check: bool = False,
                 on_wait: Callable[[str], None] | None = None) -> None:
        self.path = Path(path)
        self.timeout_ms = max(0, int(timeout * 1000))
        self.on_wait = on_wait
        # One connection serves every thread of a process (a server's event loop, its adapt thread, a
        # rollback request): a transaction is the connection's, so one thread writes at a time.
        self._writing = threading.RLock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(os.path.abspath(self.path.parent))  # the workspace: stored paths are relative to it
        if not check_file(self.path):
            create_file(self.path, lambda db: apply_migrations(db, self.root))
        conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {self.timeout_ms}")
            self.db = sqlite_utils.Database(conn)
            with self._errors():
                if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                    conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                if check:
                    problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
                    if problems != ["ok"]:
                        raise damaged(self.path, "SQLite finds it damaged (" + "; ".join(problems) + ")")
                self._migrate()
        except BaseException:
            conn.close()
            raise

    @classmethod
    def open(cls, workspace: str | os.PathLike | None = None, **kw: Any) -> RunLog:
        return cls(runlog_path(workspace), **kw)

    def close(self) -> None:
        self.db.conn.close()

    # -- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite's damage and lock errors as RunLogError naming the file (no traceback reaches a user)."""
        try:
            yield
        except sqlite3.DatabaseError as err:
            if isinstance(err, sqlite3.IntegrityError):
                raise
            if sqlite_code(err) in DAMAGE_CODES:
                raise damaged(self.path, f"SQLite says: {err}") from None
            if sqlite_code(err) in BUSY_CODES:
                raise self._busy() from None
            raise

    def _busy(self) -> RunLogBusy:
        return RunLogBusy(f"{self.path}: another process held the run log's write lock for over "
                          f"{self.timeout_ms / 1000:g} s, so this command gave up waiting. The run log itself is "
                          "fine: try again when that process is done")

    def _begin(self, wait: bool) -> None:
        """BEGIN IMMEDIATE; when another process is writing, say so (once) and wait up to the busy timeout.
        `wait=False`: give up at once (RunLogBusy)."""
        conn = self.db.conn
        first = min(FIRST_WAIT_MS, self.timeout_ms) if wait else 0
        conn.execute(f"PRAGMA busy_timeout = {first}")
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as err:
            if sqlite_code(err) not in BUSY_CODES:
                raise
            if not wait or first >= self.timeout_ms:
                raise self._busy() from None
            if self.on_wait:
                self.on_wait(f"{self.path}: another process is writing to the run log; waiting for it to finish "
                             f"(up to {self.timeout_ms / 1000:g} s)")
            conn.execute(f"PRAGMA busy_timeout = {self.timeout_ms - first}")
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as again:
                if sqlite_code(again) in BUSY_CODES:
                    raise self._busy() from None
                raise
        finally:
            conn.execute(f"PRAGMA busy_timeout = {self.timeout_ms}")

    @contextmanager
    def _write(self, *, wait: bool = True) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: takes the write lock up front so no reader-upgrade deadlock."""
        conn = self.db.conn
        with self._writing, self._errors():
            self._begin(wait)
            try:
                yield conn
            except BaseException:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

    def _migrate(self) -> None:
        """Bring an older log forward; a current one is only read (no write lock)."""
        version = self.schema_version
        if version > len(MIGRATIONS):
            raise RunLogError(f"{self.path}: written by a newer adaflash (schema version {version}; this one knows "
                              f"up to {len(MIGRATIONS)}): upgrade adaflash to read it")
        if version == len(MIGRATIONS):
            return
        with self._write():
            apply_migrations(self.db, self.root)

    @property
    def schema_version(self) -> int:
        with self._errors():
            return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def _insert(self, table: str, row: dict[str, Any]) -> int:
        with self._write():
            return int(self.db[table].insert(row).last_pk)

    def _update(self, table: str, pk: Any, fields: dict[str, Any]) -> None:
        if not fields:
            return
        with self._write():
            self.db[table].update(pk, fields)

    def _rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        with self._errors():
            cursor = self.db.execute(sql, list(params))
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    # -- runs -------------------------------------------------------------------------------
    def create_run(
        self,
        kind: str,
        *,
        name: str | None = None,
        method: str | None = None,
        target: str | None = None,
        draft: str | None = None,
        dataset: str | None = None,
        config: dict[str, Any] | None = None,
        run_dir: str | None = None,
        status: str = "running",
        run_id: str | None = None,
        parent_id: str | None = None,
        parent_job: str | None = None,
    ) -> str:
        """A new run; its id (unless given) is drawn again in the rare case it is taken (same second, kind, 4 hex).

        Its parent: `parent_id` when given, else the run whose job this process is (the jobs runner passes
        ADAFLASH_RUN_ID and ADAFLASH_JOB to every job), when that run is in this log."""
        if parent_id is None:
            parent_id, parent_job = self._parent_from_env()
        row = {
            "id": run_id or new_run_id(kind), "kind": kind, "name": name or kind, "method": method, "target": target,
            "draft": draft, "dataset": dataset, "status": status, "created_at": time.time(),
            "config": json.dumps(config or {}, default=str), "run_dir": store_path(run_dir, self.root),
            "pid": os.getpid(), "pid_start_time": process_start_time(os.getpid()), "host": os.uname().nodename,
            "parent_id": parent_id, "parent_job": parent_job,
        }
        for _ in range(16):
            try:
                with self._write():
                    self.db["runs"].insert(row)
                return str(row["id"])
            except sqlite3.IntegrityError:
                if run_id:
                    raise
                row["id"] = new_run_id(kind)
        raise RuntimeError(f"{self.path}: no free run id for kind {kind!r}")

    def _parent_from_env(self) -> tuple[str | None, str | None]:
        parent = os.environ.get("ADAFLASH_RUN_ID")
        if not parent or not self._rows("SELECT 1 FROM runs WHERE id = ?", [parent]):
            return None, None
        return parent, os.environ.get("ADAFLASH_JOB") or None

    def _stored(self, table: str, fields: dict[str, Any]) -> dict[str, Any]:
        for column in PATH_COLUMNS[table]:
            if column in fields:
                fields[column] = store_path(fields[column], self.root)
        return fields

    def _run(self, row: dict[str, Any]) -> dict[str, Any]:
        return load_paths(_decode(row, ["config"]), "runs", self.root)

    def update_run(self, run_id: str, **fields: Any) -> None:
        _with_start_time(fields)
        self._stored("runs", fields)
        if "config" in fields and not isinstance(fields["config"], str):
            fields["config"] = json.dumps(fields["config"], default=str)
        self._update("runs", run_id, fields)

    def finish_run(self, run_id: str, status: str = "finished", **fields: Any) -> None:
        self.update_run(run_id, status=status, ended_at=time.time(), **fields)

    def get_run(self, run_id: str) -> dict[str, Any]:
        """A run by id or unique prefix; KeyError names what was asked for."""
        rows = self._rows("SELECT * FROM runs WHERE id = ?", [run_id])
        if not rows:
            rows = self._rows("SELECT * FROM runs WHERE id LIKE ? ORDER BY created_at", [run_id + "%"])
        if not rows:
            raise KeyError(f"no run {run_id!r} in {self.path}")
        if len(rows) > 1:
            raise KeyError(f"run id prefix {run_id!r} is ambiguous: {', '.join(r['id'] for r in rows[:5])}")
        return self._run(rows[0])

    def list_runs(
        self,
        *,
        kind: str | None = None,
        status: str | None = None,
        method: str | None = None,
        target: str | None = None,
        dataset: str | None = None,
        text: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; `text`: a case-insensitive substring of the id, name, kind, method, target, dataset,
        status or note."""
        where, params = self._run_filter(kind=kind, status=status, method=method, target=target, dataset=dataset,
                                         text=text)
        sql = f"SELECT * FROM runs{where} ORDER BY created_at DESC, id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [self._run(r) for r in self._rows(sql, params)]

    def count_runs(self, **filters: str | None) -> int:
        """How many runs `list_runs` with these filters would give without a limit."""
        where, params = self._run_filter(**filters)
        return int(self._rows(f"SELECT COUNT(*) AS n FROM runs{where}", params)[0]["n"])

    def run_values(self, column: str) -> list[str]:
        """The distinct values of a run column that filters take (method, target, dataset, status, kind)."""
        if column not in RUN_FILTER_COLUMNS:
            raise ValueError(f"runs cannot be filtered by {column!r}")
        rows = self._rows(f"SELECT DISTINCT {column} AS v FROM runs WHERE {column} IS NOT NULL ORDER BY v")
        return [str(r["v"]) for r in rows]

    @staticmethod
    def _run_filter(*, text: str | None = None, **equal: str | None) -> tuple[str, list[Any]]:
        where, params = [], []
        for column, value in equal.items():
            if column not in RUN_FILTER_COLUMNS:
                raise ValueError(f"runs cannot be filtered by {column!r}")
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if text:
            escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append("(" + " OR ".join(f"{c} LIKE ? ESCAPE '\\'" for c in RUN_TEXT_COLUMNS) + ")")
            params += [f"%{escaped}%"] * len(RUN_TEXT_COLUMNS)
        return (" WHERE " + " AND ".join(where) if where else ""), params

    def runs_since(self, after_created: float = 0.0) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM runs WHERE created_at > ? ORDER BY created_at", [after_created])
        return [self._run(r) for r in rows]

    def child_runs(self, run: dict[str, Any], jobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Every run under this one (children, their children, ...), oldest first. Each gets a `job` key: the
        job of this run whose process created that branch (a recipe's `adaflash bench matrix` job, say).

        Runs from before `parent_id` (or made where the jobs runner's environment did not reach) are
        still found the old way: same host, created after the run, by the pid of one of its jobs."""
        rows = self._rows(
            "WITH RECURSIVE tree (id, job, depth) AS (SELECT id, parent_job, 1 FROM runs WHERE parent_id = ? "
            "UNION ALL SELECT runs.id, tree.job, tree.depth + 1 FROM runs JOIN tree ON runs.parent_id = tree.id "
            "WHERE tree.depth < 32) SELECT runs.*, tree.job AS job FROM tree JOIN runs ON runs.id = tree.id "
            "ORDER BY runs.created_at, runs.id", [run["id"]])
        found = {r["id"]: self._run(r) for r in rows}
        by_pid = {j["pid"]: j for j in (self.jobs(run["id"]) if jobs is None else jobs) if j.get("pid")}
        if by_pid:
            for other in self.runs_since(run["created_at"]):
                job = by_pid.get(other.get("pid"))
                if (job is None or other["id"] == run["id"] or other["id"] in found or other.get("parent_id")
                        or other.get("host") != run.get("host")):
                    continue
                created = other["created_at"]
                if job.get("started_at") and (created < job["started_at"] - 1
                                              or (job.get("ended_at") and created > job["ended_at"])):
                    continue  # the same pid, but not while that job ran
                found[other["id"]] = {**other, "job": job["name"]}
        return sorted(found.values(), key=lambda r: (r["created_at"], r["id"]))

    def reap_lost_runs(self, *, wait: bool = True) -> list[str]:
        """Mark live runs of this host whose process is gone as failed; returns their ids.

        `wait=False` (commands that only read): when another process is writing, leave it for later
        rather than wait for the write lock.

        A run killed with SIGKILL (or with its machine) cannot record its end and would read as
        running forever. Only runs whose process's create time was recorded are judged (so a reused
        pid is told apart), never runs of another host or runs a Slurm job carries on. The update is
        conditional: a run that recorded its end meanwhile keeps it.
        """
        rows = self._rows(
            "SELECT id, pid, pid_start_time, config FROM runs WHERE status IN (?, ?, ?) AND host = ? "
            "AND pid IS NOT NULL AND pid_start_time IS NOT NULL", [*LIVE_RUN_STATUSES, os.uname().nodename])
        lost = []
        for run in rows:
            config = _decode(run, ["config"]).get("config")
            if isinstance(config, dict) and config.get("backend") == "slurm":
                continue
            started = process_start_time(run["pid"])
            if started is not None and abs(started - run["pid_start_time"]) <= START_TIME_TOLERANCE:
                continue
            note = f"its process (pid {run['pid']}) ended without recording an end (killed?)"
            now = time.time()
            try:
                with self._write(wait=wait):
                    changed = self.db.execute(
                        "UPDATE runs SET status = 'failed', ended_at = ?, note = ? WHERE id = ? AND status IN (?, ?, ?)",
                        [now, note, run["id"], *LIVE_RUN_STATUSES]).rowcount
                    if changed:
                        self._fail_dead_jobs(run["id"], now)
            except RunLogBusy:
                if wait:
                    raise
                break
            if changed:
                lost.append(run["id"])
        return lost

    def _fail_dead_jobs(self, run_id: str, now: float) -> None:
        """The live-looking jobs of a lost run whose process is gone too (jobs still running are left)."""
        for job in self._rows("SELECT id, pid, started_at FROM jobs WHERE run_id = ? AND status IN (?, ?, ?, ?, ?)",
                              [run_id, *LIVE_JOB_STATUSES]):
            started = process_start_time(job["pid"])
            if started is not None and job["started_at"] is not None and started <= job["started_at"] + 5.0:
                continue
            self.db.execute("UPDATE jobs SET status = 'failed', ended_at = ?, message = ? WHERE id = ?",
                            [now, "its run's process ended without recording an end", job["id"]])

    # -- jobs -------------------------------------------------------------------------------
    def add_job(
        self,
        run_id: str,
        name: str,
        command: list[str],
        *,
        role: str | None = None,
        gpus: str | None = None,
        log_path: str | None = None,
        status: str = "pending",
    ) -> int:
        return self._insert("jobs", {
            "run_id": run_id, "name": name, "role": role, "command": json.dumps(command),
            "gpus": gpus, "status": status, "log_path": store_path(log_path, self.root), "restarts": 0,
        })

    def update_job(self, job_id: int, **fields: Any) -> None:
        _with_start_time(fields)
        self._stored("jobs", fields)
        if "command" in fields and not isinstance(fields["command"], str):
            fields["command"] = json.dumps(fields["command"])
        self._update("jobs", job_id, fields)

    def jobs(self, run_id: str | None = None) -> list[dict[str, Any]]:
        if run_id is None:
            rows = self._rows("SELECT * FROM jobs ORDER BY id")
        else:
            rows = self._rows("SELECT * FROM jobs WHERE run_id = ? ORDER BY id", [run_id])
        return [load_paths(_decode(r, ["command"]), "jobs", self.root) for r in rows]

    def get_job(self, job_id: int) -> dict[str, Any]:
        rows = self._rows("SELECT * FROM jobs WHERE id = ?", [job_id])
        if not rows:
            raise KeyError(f"no job {job_id} in {self.path}")
        return load_paths(_decode(rows[0], ["command"]), "jobs", self.root)

    # -- metrics and events -------------------------------------------------------------------
    def log_metrics(
        self, run_id: str, values: dict[str, float], *, step: int | None = None, version: int | None = None,
        job: str | None = None,
    ) -> None:
        """Values measured together. `step`: how far the writer was in its own work when it measured them
        (training steps, samples produced, prompts answered); `version`: the drafter version they measured."""
        now = time.time()
        rows = [
            {"run_id": run_id, "job": job, "step": step, "version": version, "name": name, "value": float(value),
             "time": now}
            for name, value in values.items()
            if value is not None
        ]
        if rows:
            with self._write():
                self.db["metrics"].insert_all(rows)

    def log_metric(self, run_id: str, name: str, value: float, **kw: Any) -> None:
        self.log_metrics(run_id, {name: value}, **kw)

    def metrics_since(
        self,
        after_id: int = 0,
        *,
        run_id: str | None = None,
        names: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Rows with id > after_id, oldest first: the incremental read every follower uses."""
        where, params = ["id > ?"], [after_id]
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        if names is not None:
            names = list(names)
            where.append(f"name IN ({', '.join('?' * len(names))})")
            params.extend(names)
        sql = f"SELECT * FROM metrics WHERE {' AND '.join(where)} ORDER BY id"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return self._rows(sql, params)

    def last_metrics(self, run_id: str) -> dict[str, float]:
        """The newest value of each metric of a run."""
        rows = self._rows(
            "SELECT name, value FROM metrics WHERE id IN "
            "(SELECT MAX(id) FROM metrics WHERE run_id = ? GROUP BY name)",
            [run_id],
        )
        return {r["name"]: r["value"] for r in rows}

    def log_event(self, run_id: str, message: str, *, level: str = "info", job: str | None = None) -> None:
        self._insert("events", {"run_id": run_id, "job": job, "level": level, "message": message,
                                "time": time.time()})

    def events_since(self, after_id: int = 0, *, run_id: str | None = None) -> list[dict[str, Any]]:
        if run_id is None:
            return self._rows("SELECT * FROM events WHERE id > ? ORDER BY id", [after_id])
        return self._rows("SELECT * FROM events WHERE id > ? AND run_id = ? ORDER BY id", [after_id, run_id])

    # -- benchmark results and checkpoints ------------------------------------------------------
    def add_bench_result(self, run_id: str, record: dict[str, Any]) -> int:
        """One benchmark run: indexed key columns plus the whole record (SGLang's key names) as JSON."""
        row = {
            "run_id": run_id,
            "label": record.get("label"),
            "method": record.get("method"),
            "target": record.get("target"),
            "draft": record.get("draft"),
            "dataset": record.get("dataset"),
            "concurrency": record.get("concurrency", record.get("max_concurrency")),
            "num_prompts": record.get("num_prompts", record.get("completed")),
            "output_throughput": record.get("output_throughput"),
            "accept_length": record.get("accept_length"),
            "accuracy": record.get("accuracy"),
            "data": json.dumps(record, default=str),
            "time": time.time(),
            "content_hash": record.get("content_hash"),
        }
        return self._insert("bench_results", row)

    def imported_results(self, hashes: Iterable[str]) -> dict[str, str]:
        """Of these content hashes, those the log already holds → the run that holds each."""
        found: dict[str, str] = {}
        wanted = list(dict.fromkeys(hashes))
        for start in range(0, len(wanted), 500):
            chunk = wanted[start:start + 500]
            rows = self._rows(f"SELECT content_hash, run_id FROM bench_results WHERE content_hash IN "
                              f"({', '.join('?' * len(chunk))})", chunk)
            found.update({r["content_hash"]: r["run_id"] for r in rows})
        return found

    def bench_results(self, run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        if run_ids is None:
            rows = self._rows("SELECT * FROM bench_results ORDER BY id")
        else:
            ids = list(run_ids)
            rows = self._rows(
                f"SELECT * FROM bench_results WHERE run_id IN ({', '.join('?' * len(ids))}) ORDER BY id", ids
            )
        return [_decode(r, ["data"]) for r in rows]

    def add_checkpoint(
        self,
        run_id: str,
        path: str,
        *,
        kind: str = "drafter",
        version: int | None = None,
        step: int | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> int:
        return self._insert("checkpoints", {
            "run_id": run_id, "kind": kind, "path": store_path(str(path), self.root), "version": version, "step": step,
            "metrics": json.dumps(metrics or {}), "time": time.time(),
        })

    def checkpoints(self, run_id: str | None = None) -> list[dict[str, Any]]:
        if run_id is None:
            rows = self._rows("SELECT * FROM checkpoints ORDER BY id")
        else:
            rows = self._rows("SELECT * FROM checkpoints WHERE run_id = ? ORDER BY id", [run_id])
        return [load_paths(_decode(r, ["metrics"]), "checkpoints", self.root) for r in rows]
