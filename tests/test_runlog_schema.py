"""The run log as a database: a log from before schema 3 carried forward, foreign keys, one meaning per
column, parent runs, workspace-relative paths, and the documented queries over the views."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from adaflash.runlog import MIGRATIONS, RunLog

FIXTURES = Path(__file__).parent / "fixtures"
DOC = Path(__file__).parents[1] / "docs" / "runlog.md"
SERVED = ("served_requests", "served_tau_sum", "served_tokens", "served_verify")


def documented_queries() -> dict[str, str]:
    """The SQL blocks of docs/runlog.md tagged `-- query: NAME`, exactly as written there."""
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)
    return {m.group(1): block for block in blocks if (m := re.search(r"-- query: ([\w-]+)", block))}


def _old_log(ws: Path) -> dict[str, str]:
    """A log with the schema (user_version 2) and the records the code before schema 3 wrote: served_* rows
    with step = drafter version, absolute paths, children tied by a job's pid or config.matrix_run."""
    ws.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(ws / "runlog.sqlite"))
    conn.executescript((FIXTURES / "runlog_v2.sql").read_text())

    def run(rid: str, kind: str, created: float, pid: int, **more) -> str:
        row = {"id": rid, "kind": kind, "name": kind, "status": "finished", "created_at": created, "pid": pid,
               "host": "h", "config": "{}", **more}
        conn.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
        return rid

    recipe = run("r-recipe", "recipe", 100.0, 111, run_dir=str(ws / "runs" / "r-recipe"))
    conn.execute("INSERT INTO jobs (run_id, name, command, pid, status, log_path, started_at, ended_at) "
                 "VALUES (?, 'bench', '[]', 222, 'finished', ?, 105.0, 200.0)",
                 [recipe, str(ws / "runs" / "r-recipe" / "bench.log")])
    matrix = run("r-matrix", "bench-matrix", 110.0, 222)
    cell = run("r-cell", "bench", 120.0, 222, method="dflash", config=json.dumps({"matrix_run": matrix}))
    later = run("r-later", "bench", 300.0, 222)  # the same pid after the job ended: not a child
    pipeline = run("r-pipe", "pipeline", 130.0, 333, run_dir=str(ws / "runs" / "r-pipe"))
    conn.execute("INSERT INTO jobs (run_id, name, command, status, log_path) VALUES (?, 'inference', '[]', "
                 "'finished', ?)", [pipeline, str(ws / "runs" / "r-pipe" / "inference.log")])
    conn.execute("INSERT INTO jobs (run_id, name, command, status, log_path) VALUES (?, 'outside', '[]', "
                 "'finished', '/elsewhere/outside.log')", [pipeline])
    conn.execute("INSERT INTO checkpoints (run_id, kind, path, version, step, metrics, time) VALUES "
                 "(?, 'drafter', ?, 1, 7, '{}', 15.0)", [pipeline, str(ws / "runs" / "r-pipe" / "swap" / "weights" / "v1")])

    def metrics(t: float, values: dict, step: int | None, job: str) -> None:
        for name, value in values.items():
            conn.execute("INSERT INTO metrics (run_id, job, step, name, value, time) VALUES (?, ?, ?, ?, ?, ?)",
                         [pipeline, job, step, name, value, t])

    metrics(10.0, {"tau": 1.5, "drafter_version": 0, "samples": 3}, 3, "inference")
    metrics(10.1, dict(zip(SERVED, (3, 4.5, 100, 70))), 0, "inference")  # step = version, the old way
    metrics(15.0, {"published_version": 1, "consumed": 5}, 7, "training")
    metrics(20.0, {"tau": 2.0, "drafter_version": 1, "samples": 6}, 6, "inference")
    metrics(20.1, dict(zip(SERVED, (2, 6.0, 60, 20))), 1, "inference")
    conn.execute("INSERT INTO events (run_id, level, message, time) VALUES (?, 'info', 'hi', 1.0)", [pipeline])
    for method, speed in (("vanilla", 100.0), ("dflash", 170.0)):
        data = {"method": method, "target": "t", "dataset": "d", "concurrency": 1, "matrix_run": matrix,
                "output_throughput": speed}
        conn.execute("INSERT INTO bench_results (run_id, method, target, dataset, concurrency, output_throughput, "
                     "data, time) VALUES (?, ?, 't', 'd', 1, ?, ?, 1.0)", [cell, method, speed, json.dumps(data)])
    conn.commit()
    conn.close()
    return {"recipe": recipe, "matrix": matrix, "cell": cell, "later": later, "pipeline": pipeline}


def test_a_log_from_before_is_carried_forward(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ids = _old_log(ws)
    log = RunLog.open(ws)
    assert log.schema_version == len(MIGRATIONS)
    db = log.db
    for table in ("jobs", "metrics", "events", "bench_results", "checkpoints"):
        assert [(fk.column, fk.other_table, fk.other_column) for fk in db[table].foreign_keys] == \
            [("run_id", "runs", "id")], table
    assert [(fk.column, fk.other_table) for fk in db["runs"].foreign_keys] == [("parent_id", "runs")]
    assert {t: db[t].count for t in ("metrics", "events", "bench_results", "checkpoints", "jobs", "runs")} == \
        {"metrics": 16, "events": 1, "bench_results": 2, "checkpoints": 1, "jobs": 3, "runs": 5}

    rows = db.execute("SELECT name, step, version, time FROM metrics ORDER BY id").fetchall()
    served = [(n, s, v) for n, s, v, _ in rows if n in SERVED]
    assert {s for _, s, _ in served} == {None} and sorted({v for _, _, v in served}) == [0, 1]
    assert [(s, v) for n, s, v, t in rows if n == "tau"] == [(3, 0), (6, 1)]  # a count, and the version measured
    assert [(n, s, v) for n, s, v, t in rows if t == 15.0] == [("published_version", 7, 1), ("consumed", 7, 1)]

    parents = dict(db.execute("SELECT id, parent_id FROM runs").fetchall())
    assert parents == {ids["recipe"]: None, ids["matrix"]: ids["recipe"], ids["cell"]: ids["matrix"],
                       ids["later"]: None, ids["pipeline"]: None}
    assert log.get_run(ids["matrix"])["parent_job"] == "bench"

    raw = dict(db.execute("SELECT id, run_dir FROM runs WHERE run_dir IS NOT NULL").fetchall())
    assert raw == {ids["recipe"]: "runs/r-recipe", ids["pipeline"]: "runs/r-pipe"}
    assert log.get_run(ids["pipeline"])["run_dir"] == str(ws / "runs" / "r-pipe")
    assert {j["name"]: j["log_path"] for j in log.jobs(ids["pipeline"])} == {
        "inference": str(ws / "runs" / "r-pipe" / "inference.log"), "outside": "/elsewhere/outside.log"}
    assert db.execute("SELECT path FROM checkpoints").fetchone()[0] == "runs/r-pipe/swap/weights/v1"

    from adaflash.pipeline.report import pipeline_report

    versions = {v["drafter_version"]: v for v in pipeline_report(log, log.get_run(ids["pipeline"]),
                                                                 integrity=False)["versions"]}
    assert versions[0]["tau"] == pytest.approx(1.5) and versions[1]["tau"] == pytest.approx(3.0)
    assert [c["id"] for c in log.child_runs(log.get_run(ids["recipe"]))] == [ids["matrix"], ids["cell"]]
    log.close()
    assert RunLog.open(ws).schema_version == len(MIGRATIONS)  # once


def test_the_documented_queries_answer_the_common_questions(tmp_path: Path) -> None:
    queries = documented_queries()
    assert {"best-tau-per-run", "speedup-per-method-per-run", "run-tree"} <= set(queries)
    ws = tmp_path / "ws"
    ids = _old_log(ws)
    log = RunLog.open(ws)
    other = log.create_run("pipeline")
    log.log_metrics(other, dict(zip(SERVED, (4, 8.0, 50, 30))), version=2, job="inference")
    log.log_metrics(other, dict(zip(SERVED, (1, 1.2, 9, 8))), version=3, job="inference")
    standalone = log.create_run("bench", method="adaflash")
    log.add_bench_result(standalone, {"method": "vanilla", "target": "t", "dataset": "d", "concurrency": 4,
                                      "output_throughput": 50.0})
    log.add_bench_result(standalone, {"method": "adaflash", "target": "t", "dataset": "d", "concurrency": 4,
                                      "output_throughput": 105.0})
    run = lambda name, **params: [tuple(r) for r in log.db.execute(queries[name], params).fetchall()]  # noqa: E731

    assert run("best-tau-per-run") == [(other, 2, pytest.approx(2.0), 4), (ids["pipeline"], 1, pytest.approx(3.0), 2)]
    assert run("speedup-per-method-per-run") == [  # a new run's id (its date) sorts before the fixture's r-…
        (standalone, "adaflash", "d", 4, 2.1, 105.0, 50.0), (standalone, "vanilla", "d", 4, 1.0, 50.0, 50.0),
        (ids["matrix"], "dflash", "d", 1, 1.7, 170.0, 100.0), (ids["matrix"], "vanilla", "d", 1, 1.0, 100.0, 100.0)]
    assert run("run-tree", run=ids["recipe"]) == [(0, ids["recipe"], "recipe", "recipe", "finished", None),
                                                  (1, ids["matrix"], "bench-matrix", "bench-matrix", "finished", "bench"),
                                                  (2, ids["cell"], "bench", "bench", "finished", None)]

    from adaflash.bench.compare import comparison_rows, records_of

    rows, _ = comparison_rows(records_of(log.bench_results()))  # the view pairs rows as `runs compare` does
    view = {r[0]: r[1] for r in log.db.execute("SELECT result_id, speedup FROM bench_speedup").fetchall()}
    assert {r["result_id"]: r["speedup"] for r in rows} == {k: pytest.approx(v) for k, v in view.items()}


def runs_made_inside_a_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RunLog, str, str, str]:
    """A recipe run whose job "bench" creates a matrix run (parent from the job's environment), which creates a
    cell run (an explicit parent): the log and the three ids."""
    log = RunLog.open(tmp_path)
    recipe = log.create_run("recipe")
    monkeypatch.setenv("ADAFLASH_RUN_ID", recipe)
    monkeypatch.setenv("ADAFLASH_JOB", "bench")
    matrix = log.create_run("bench-matrix")
    cell = log.create_run("bench", parent_id=matrix)
    return log, recipe, matrix, cell


def test_a_run_created_inside_a_job_records_its_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, recipe, matrix, cell = runs_made_inside_a_job(tmp_path, monkeypatch)
    assert (log.get_run(matrix)["parent_id"], log.get_run(matrix)["parent_job"]) == (recipe, "bench")
    assert log.get_run(cell)["parent_id"] == matrix
    assert [(c["id"], c["job"]) for c in log.child_runs(log.get_run(recipe))] == [(matrix, "bench"), (cell, "bench")]
    monkeypatch.setenv("ADAFLASH_RUN_ID", "a-run-of-another-workspace")
    assert log.get_run(log.create_run("bench"))["parent_id"] is None


def test_paths_are_stored_relative_to_the_workspace_and_follow_a_copy(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    log = RunLog.open(ws)
    run = log.create_run("pipeline", run_dir=str(ws / "runs" / "x"))
    job = log.add_job(run, "inference", ["w"], log_path=str(ws / "runs" / "x" / "inference.log"))
    log.add_checkpoint(run, str(ws / "runs" / "x" / "weights" / "v1"), version=1)
    log.update_job(job, log_path=str(ws / "runs" / "x" / "again.log"))
    assert log.db.execute("SELECT run_dir FROM runs").fetchone()[0] == "runs/x"
    assert log.db.execute("SELECT log_path FROM jobs").fetchone()[0] == "runs/x/again.log"
    log.close()
    copy = tmp_path / "copy"
    shutil.copytree(ws, copy)
    moved = RunLog.open(copy)
    assert moved.get_run(run)["run_dir"] == str(copy / "runs" / "x")
    assert moved.jobs(run)[0]["log_path"] == str(copy / "runs" / "x" / "again.log")
    assert moved.checkpoints(run)[0]["path"] == str(copy / "runs" / "x" / "weights" / "v1")


def test_runs_show_lists_the_runs_under_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from adaflash.cli.main import cli

    _, recipe, matrix, cell = runs_made_inside_a_job(tmp_path, monkeypatch)
    monkeypatch.delenv("ADAFLASH_RUN_ID")
    shown = CliRunner().invoke(cli, ["--workspace", str(tmp_path), "runs", "show", recipe, "--json"])
    assert shown.exit_code == 0, shown.output
    children = json.loads(shown.output)["children"]
    assert [(c["id"], c["parent_id"], c["job"]) for c in children] == [(matrix, recipe, "bench"), (cell, matrix, "bench")]
