import multiprocessing as mp
import threading

import pytest

from adaflash.runlog import MIGRATIONS, RunLog


def test_created_migrated_and_wal(tmp_path):
    log = RunLog(tmp_path / "log.sqlite")
    assert log.schema_version == len(MIGRATIONS)
    assert log.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {"runs", "jobs", "metrics", "events", "bench_results", "checkpoints"} <= set(log.db.table_names())
    # opening again does not re-run migrations
    again = RunLog(tmp_path / "log.sqlite")
    assert again.schema_version == len(MIGRATIONS)


def test_runs_jobs_and_incremental_metrics(tmp_path):
    log = RunLog(tmp_path / "log.sqlite")
    run = log.create_run("pipeline", method="adaflash", target="smollm2-135m", config={"a": 1})
    other = log.create_run("bench", method="vanilla")
    assert log.get_run(run)["config"] == {"a": 1}
    assert log.get_run(run[:-2])["id"] == run  # a unique prefix is enough
    assert log.get_run(other)["kind"] == "bench"
    job = log.add_job(run, "infer", ["adaflash", "pipeline"], role="inference", gpus="0")
    log.update_job(job, status="running", pid=123)
    assert log.jobs(run)[0]["command"] == ["adaflash", "pipeline"]
    log.log_metrics(run, {"tau": 1.5, "tok_s": 10.0}, step=1)
    first = log.metrics_since(0, run_id=run)
    assert [m["name"] for m in first] == ["tau", "tok_s"]
    log.log_metrics(run, {"tau": 2.5}, step=2)
    newer = log.metrics_since(first[-1]["id"], run_id=run)
    assert [(m["name"], m["value"]) for m in newer] == [("tau", 2.5)]
    assert log.last_metrics(run)["tau"] == 2.5
    log.finish_run(run)
    assert log.get_run(run)["status"] == "finished"
    assert [r["id"] for r in log.list_runs(kind="pipeline")] == [run]
    with pytest.raises(KeyError, match="no run"):
        log.get_run("nope")


def _writer(path: str, run_id: str, worker: int, count: int) -> None:
    log = RunLog(path)
    for step in range(count):
        log.log_metrics(run_id, {f"w{worker}": float(step)}, step=step)
        if step % 25 == 0:
            log.log_event(run_id, f"worker {worker} at {step}")


def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "log.sqlite")
    run = RunLog(path).create_run("stress")
    workers, count = 4, 150
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, run, w, count)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    rows = RunLog(path).metrics_since(0, run_id=run)
    assert len(rows) == workers * count
    for w in range(workers):
        steps = sorted(r["step"] for r in rows if r["name"] == f"w{w}")
        assert steps == list(range(count))
    assert len(RunLog(path).events_since(0, run_id=run)) == workers * (count // 25 + (1 if count % 25 else 0))


def test_threads_sharing_one_run_log_write_at_once_and_lose_nothing(tmp_path):
    # A server's event loop, its adapt thread and a rollback request all write through one RunLog.
    log = RunLog(tmp_path / "log.sqlite")
    run = log.create_run("serve")
    errors: list[str] = []

    def write(worker: int) -> None:
        for step in range(300):
            try:
                log.log_metrics(run, {f"t{worker}": float(step), "other": 0.0}, step=step)
                log.log_event(run, f"thread {worker} at {step}")
            except Exception as err:  # noqa: BLE001 - collected: the assertion names the first
                errors.append(repr(err))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    rows = log.metrics_since(0, run_id=run)
    assert all(sorted(r["step"] for r in rows if r["name"] == f"t{w}") == list(range(300)) for w in range(3))
    assert len(rows) == 3 * 300 * 2 and len(log.events_since(0, run_id=run)) == 3 * 300


def _run_in_a_process_that_dies(path, kind, config=None):
    """A run created by another process that then exits without recording an end (as after SIGKILL)."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; from adaflash.runlog import RunLog; log = RunLog(sys.argv[1]); "
            "run = log.create_run(sys.argv[2], config=json.loads(sys.argv[3])); "
            "job = log.add_job(run, 'worker', ['w'], status='running'); "
            "log.update_job(job, pid=__import__('os').getpid(), started_at=__import__('time').time()); print(run)")
    done = subprocess.run([sys.executable, "-c", code, str(path), kind, json.dumps(config or {})],
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def test_runs_whose_process_died_without_an_end_are_marked_failed(tmp_path):
    path = tmp_path / "log.sqlite"
    log = RunLog(path)
    dead = _run_in_a_process_that_dies(path, "pipeline")
    slurm = _run_in_a_process_that_dies(path, "recipe", {"backend": "slurm"})  # its work goes on in Slurm
    elsewhere = _run_in_a_process_that_dies(path, "pipeline")
    log.update_run(elsewhere, host="another-machine")  # a shared workspace: not ours to judge
    unknown = _run_in_a_process_that_dies(path, "pipeline")
    log.update_run(unknown, pid_start_time=None)  # recorded before create times were: left as it is
    ended = _run_in_a_process_that_dies(path, "bench")
    log.finish_run(ended, "finished")
    mine = log.create_run("pipeline")
    assert log.get_run(mine)["pid_start_time"] is not None

    assert log.reap_lost_runs() == [dead]
    run = log.get_run(dead)
    assert run["status"] == "failed" and "ended without recording an end" in run["note"] and run["ended_at"]
    assert [j["status"] for j in log.jobs(dead)] == ["failed"]
    assert {r: log.get_run(r)["status"] for r in (slurm, elsewhere, unknown, ended, mine)} == {
        slurm: "running", elsewhere: "running", unknown: "running", ended: "finished", mine: "running"}
    assert [j["status"] for j in log.jobs(slurm)] == ["running"]
    assert log.reap_lost_runs() == []  # judged once


def test_an_older_run_log_gains_the_create_time_column(tmp_path):
    import sqlite_utils

    from adaflash.runlog import _migration_1

    db = sqlite_utils.Database(tmp_path / "old.sqlite")
    _migration_1(db)
    db.execute("PRAGMA user_version = 1")
    db["runs"].insert({"id": "r1", "kind": "pipeline", "status": "running", "pid": 1, "host": "h", "created_at": 1.0})
    db.conn.close()
    log = RunLog(tmp_path / "old.sqlite")
    assert log.schema_version == len(MIGRATIONS)
    assert log.get_run("r1")["pid_start_time"] is None and log.get_run("r1")["status"] == "running"


def test_a_taken_run_id_is_drawn_again_unless_it_was_given(tmp_path, monkeypatch):
    import sqlite3

    import adaflash.runlog as runlog

    log = RunLog(tmp_path / "log.sqlite")
    first = log.create_run("bench")
    draws = iter([first, first, "fresh-id"])
    monkeypatch.setattr(runlog, "new_run_id", lambda kind: next(draws))
    assert log.create_run("bench") == "fresh-id"
    with pytest.raises(sqlite3.IntegrityError):
        log.create_run("bench", run_id=first)


def test_a_runs_own_process_is_its_supervisor_while_it_lives(tmp_path):
    from jobs.control import supervisor_pid

    log = RunLog(tmp_path / "log.sqlite")
    mine = log.create_run("pipeline", run_dir=str(tmp_path))
    assert supervisor_pid(log.get_run(mine)) == __import__("os").getpid()  # no supervisor file, no id on a command line
    dead = _run_in_a_process_that_dies(tmp_path / "log.sqlite", "pipeline")
    log.update_run(dead, run_dir=str(tmp_path))
    assert supervisor_pid(log.get_run(dead)) is None
    log.update_run(mine, pid_start_time=log.get_run(mine)["pid_start_time"] - 100)  # a recycled pid
    assert supervisor_pid(log.get_run(mine)) is None


def test_a_job_recorded_with_a_pid_gets_its_create_time(workspace):
    """`runs stop` tells a job's process from a later one with the same pid by it (pipeline workers had none)."""
    import os

    from adaflash.runlog import RunLog, process_start_time

    log = RunLog.open(workspace)
    job = log.add_job(log.create_run("pipeline"), "inference", ["w"], role="inference", gpus="cpu", log_path="x")
    log.update_job(job, pid=os.getpid())
    assert log.get_job(job)["pid_start_time"] == process_start_time(os.getpid())
    log.update_job(job, pid=os.getpid(), pid_start_time=1.0)  # given explicitly: kept
    assert log.get_job(job)["pid_start_time"] == 1.0
