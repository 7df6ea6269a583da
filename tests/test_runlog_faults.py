"""The run log under faults: another process holding the write lock, and damaged files.

Readers must never wait for (or need) the write lock; a writer that waits says why; a damaged file
is refused with an error naming it, a nonzero exit, and not one byte written to it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.runlog import RunLog, RunLogBusy, RunLogError

HOLD_LOCK = (
    "import sqlite3, sys; conn = sqlite3.connect(sys.argv[1], isolation_level=None); "
    "conn.execute('BEGIN IMMEDIATE'); conn.execute(\"INSERT INTO events (run_id, message) VALUES ('x', 'held')\"); "
    "print('locked', flush=True); sys.stdin.readline(); conn.execute('COMMIT')"
)


def _holding_the_lock(path: Path) -> subprocess.Popen:
    """Another process inside a write transaction until its stdin gets a line."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def _release(holder: subprocess.Popen) -> None:
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.wait(60) == 0


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def test_runs_list_and_show_read_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    log = RunLog.open(tmp_path)
    run = log.create_run("bench", method="vanilla")
    lost = log.create_run("pipeline")
    log.update_run(lost, pid=_dead_pid(), pid_start_time=1.0)  # its process is gone: a writer would mark it failed
    log.close()
    holder = _holding_the_lock(tmp_path / "runlog.sqlite")
    try:
        runner = CliRunner()
        listed = runner.invoke(cli, ["--workspace", str(tmp_path), "runs", "list", "--json"])
        assert listed.exit_code == 0, listed.output
        assert run in listed.output and "waiting" not in listed.output
        shown = runner.invoke(cli, ["--workspace", str(tmp_path), "runs", "show", run])
        assert shown.exit_code == 0 and run in shown.output, shown.output
        assert RunLog.open(tmp_path).get_run(lost)["status"] == "running"  # left for a later command, not waited for
    finally:
        _release(holder)
    assert CliRunner().invoke(cli, ["--workspace", str(tmp_path), "runs", "list"]).exit_code == 0
    assert RunLog.open(tmp_path).get_run(lost)["status"] == "failed"  # once the lock is free, it is marked


def test_a_writer_says_that_it_waits_for_another_process(tmp_path: Path) -> None:
    log = RunLog.open(tmp_path)
    said: list[str] = []
    waiting = threading.Event()
    log.on_wait = lambda message: (said.append(message), waiting.set())
    other = sqlite3.connect(str(tmp_path / "runlog.sqlite"), isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    created: list[str] = []
    writer = threading.Thread(target=lambda: created.append(log.create_run("bench")))
    writer.start()
    assert waiting.wait(60), "the writer never said it was waiting"
    other.execute("COMMIT")
    writer.join(60)
    assert created and log.get_run(created[0])["kind"] == "bench"
    assert len(said) == 1 and "another process is writing to the run log; waiting" in said[0]
    assert str(tmp_path / "runlog.sqlite") in said[0]


def test_a_writer_that_waits_too_long_says_the_log_is_fine(tmp_path: Path) -> None:
    RunLog.open(tmp_path).close()
    holder = _holding_the_lock(tmp_path / "runlog.sqlite")
    try:
        log = RunLog.open(tmp_path, timeout=0.2)
        with pytest.raises(RunLogBusy) as err:
            log.create_run("bench")
    finally:
        _release(holder)
    message = str(err.value)
    assert "another process held the run log's write lock" in message and "itself is fine" in message
    assert "move" not in message and "aside" not in message


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaflash.cli.main", *argv], capture_output=True, text=True,
                          timeout=120)


def _damaged_logs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    empty = tmp_path / "empty" / "runlog.sqlite"
    empty.parent.mkdir()
    empty.touch()
    text = tmp_path / "text" / "runlog.sqlite"
    text.parent.mkdir()
    text.write_text("run,status\nr1,finished\n" * 50)
    smashed = tmp_path / "smashed" / "runlog.sqlite"
    log = RunLog(smashed)
    run = log.create_run("pipeline")
    for step in range(60):
        log.log_metrics(run, {f"m{i}": float(i) for i in range(50)}, step=step)
    log.close()
    data = bytearray(smashed.read_bytes())
    pages = len(data) // 4096
    assert pages > 20
    start = (pages // 2) * 4096
    data[start:start + 3 * 4096] = os.urandom(3 * 4096)
    smashed.write_bytes(bytes(data))
    return {"empty": (empty, "the file is empty"), "text": (text, "not an SQLite database"),
            "smashed": (smashed, "SQLite finds it damaged")}


def test_damaged_run_logs_are_refused_and_left_untouched(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text('{"backend": "sglang", "completed": 4, "output_throughput": 10.0, "max_concurrency": 1, '
                       '"server_info": {"model_path": "m", "speculative_algorithm": null}}\n')
    for name, (path, why) in _damaged_logs(tmp_path).items():
        before = _digest(path)
        for argv in (["runs", "list"], ["runs", "import", str(results)]):
            done = _cli("--workspace", str(path.parent), *argv)
            assert done.returncode != 0, (name, argv, done.stdout)
            assert str(path) in done.stderr and why in done.stderr and "Nothing was written" in done.stderr, \
                (name, argv, done.stderr)
            assert "Traceback" not in done.stderr
            assert _digest(path) == before, (name, argv)
        with pytest.raises(RunLogError, match="not a run log that can be opened"):
            RunLog(path, check=True)
        assert _digest(path) == before
    assert (tmp_path / "empty" / "runlog.sqlite").stat().st_size == 0


def test_a_new_run_log_is_never_seen_empty(tmp_path: Path) -> None:
    """A new log is made whole and linked into place: a zero-byte file would read as damage to other processes."""
    log = RunLog(tmp_path / "new.sqlite")
    assert (tmp_path / "new.sqlite").stat().st_size > 0 and log.list_runs() == []
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name) == []
