"""The run log's file: telling a run log from an empty, foreign or damaged file before SQLite writes to it,
making a new one atomically, and the errors a user sees (naming the file, never a traceback)."""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from adaflash.sqlite_db import sqlite_utils


class RunLogError(RuntimeError):
    """The run log file cannot be used (not an SQLite database, damaged, or held by a writer too long)."""


class RunLogBusy(RunLogError):
    """Another process held the write lock for longer than the busy timeout; the file itself is fine."""


BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
DAMAGE_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
FIRST_WAIT_MS = 2000  # a write waits this long in silence before it says that it is waiting


def sqlite_code(err: sqlite3.Error) -> int:
    return int(getattr(err, "sqlite_errorcode", 0) or 0) & 0xFF


def damaged(path: Path, why: str) -> RunLogError:
    return RunLogError(f"{path}: not a run log that can be opened: {why}. Nothing was written to it. Copy it "
                       "elsewhere to recover what it holds (`sqlite3 FILE .recover`), then remove it to start a "
                       "new run log there, or give another --workspace")


def check_file(path: Path) -> bool:
    """True when `path` holds an SQLite database, False when it does not exist; RunLogError for anything else.

    Read before SQLite touches the file: SQLite takes an empty file for a new database and would write
    a schema into it, and a damaged file must be left as it is."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if not path.is_file():
        raise RunLogError(f"{path}: not a file, so not a run log; give another --workspace")
    if size == 0:
        raise damaged(path, "the file is empty (0 bytes; a new run log is never empty on disk)")
    # Read through SQLite, read-only, never with open()/close() of our own: closing any descriptor of the
    # file drops every POSIX lock this process holds on it, those of its open SQLite connections too,
    # and another connection then takes itself for the last one and removes the WAL under them.
    probe = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        probe.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError as err:
        raise damaged(path, f"not an SQLite database (SQLite cannot read it: {err})") from None
    finally:
        probe.close()
    return True


def create_file(path: Path, migrate: Callable[[sqlite_utils.Database], None]) -> None:
    """A new run log made whole under a temporary name and linked into place, so no process ever sees it
    empty or half made; when another process linked one first, theirs is kept."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        conn = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            db = sqlite_utils.Database(conn)
            conn.execute("BEGIN IMMEDIATE")
            migrate(db)
            conn.execute("COMMIT")
        finally:
            conn.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: create exclusively and copy
            with suppress(FileExistsError), open(path, "xb") as out:
                out.write(tmp.read_bytes())
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            with suppress(FileNotFoundError):
                leftover.unlink()
