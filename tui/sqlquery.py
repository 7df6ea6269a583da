"""Read-only SQL over the run log, for the Query tab (Harlequin-style).

Why its own connection: the file is opened with a `mode=ro` URI and `query_only` on, so nothing typed
in the Query tab can write, lock or migrate the run log the workers are writing; one statement at a time
(sqlite3 refuses more), and at most `limit` rows are fetched so a `SELECT *` on a million metric rows
costs what is shown.
"""

from __future__ import annotations

import csv
import io
import sqlite3
import time
from contextlib import closing  # sqlite3's own context manager only commits
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROW_LIMIT = 1000


@dataclass(frozen=True)
class QueryResult:
    sql: str
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool  # more rows than the limit
    seconds: float
    error: str | None = None
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Source:
    """A starting point: a view or table of the run log."""

    name: str
    kind: str  # "view" | "table"

    @property
    def sql(self) -> str:
        order = "" if self.kind == "view" else " ORDER BY rowid DESC"
        return f'SELECT *\nFROM "{self.name}"{order}\nLIMIT 100'


def connect_ro(path: Path) -> sqlite3.Connection:
    """The run log, read-only (a missing file is an error, never a new empty database)."""
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=5.0, check_same_thread=False)
    conn.execute("PRAGMA query_only = ON")
    return conn


def sources(path: Path) -> list[Source]:
    """The run log's views first (the ready-made questions), then its tables."""
    with closing(connect_ro(path)) as conn:
        rows = conn.execute("SELECT name, type FROM sqlite_master WHERE type IN ('view', 'table') "
                            "AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '\\_%' ESCAPE '\\' "
                            "ORDER BY type = 'table', name").fetchall()
    return [Source(name, kind) for name, kind in rows]


def run_query(path: Path, sql: str, limit: int = ROW_LIMIT) -> QueryResult:
    """Run one statement read-only; an SQL error comes back in the result (shown inline), not raised."""
    started = time.perf_counter()
    text = sql.strip().rstrip(";").strip()
    if not text:
        return QueryResult(sql, [], [], False, 0.0, "nothing to run: type a query (or pick a view)")
    try:
        with closing(connect_ro(path)) as conn:
            cursor = conn.execute(text)
            columns = [d[0] for d in cursor.description or []]
            rows = cursor.fetchmany(limit + 1)
    except (sqlite3.Error, sqlite3.Warning) as err:
        return QueryResult(sql, [], [], False, time.perf_counter() - started, f"{type(err).__name__}: {err}")
    return QueryResult(sql, columns, rows[:limit], len(rows) > limit, time.perf_counter() - started)


def to_csv(result: QueryResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows(result.rows)
    return buffer.getvalue()


def to_markdown(result: QueryResult) -> str:
    def cell(value: Any) -> str:
        return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, result.columns)) + " |", "|" + "---|" * len(result.columns)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in result.rows]
    query = " ".join(result.sql.split())
    return f"<!-- {query} -->\n\n" + "\n".join(lines) + "\n"
