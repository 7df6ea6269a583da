"""What the Monitor plots and tabulates: one series per method of a benchmark matrix (Vanilla and AdaFlash
were one line), generation speed from the first seconds (the charts read "no data yet" for minutes on a
CPU), and τ per drafter version as `adaflash pipeline status` defines it, with its request count."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaflash.pipeline.report import pipeline_report
from adaflash.runlog import RunLog
from tests.test_tui_fixtures import PIPELINE_RUN, FakeInventory, fill_runlog, screen_text, settle
from tests.test_tui_flows import make_app
from tui.backend import Backend
from tui.monitor_model import CHARTS, MonitorModel


def test_tau_per_version_is_the_one_pipeline_status_and_the_run_log_give(tmp_path: Path) -> None:
    log = fill_runlog(tmp_path / "ws")
    report = pipeline_report(log, log.get_run(PIPELINE_RUN), integrity=False)["versions"]
    view = log.db.execute("SELECT drafter_version, requests, tau, tau_tokens FROM tau_per_version "
                          "WHERE run_id = ? ORDER BY drafter_version", [PIPELINE_RUN]).fetchall()
    model = MonitorModel(PIPELINE_RUN)
    model.ingest(PIPELINE_RUN, {PIPELINE_RUN: ""}, {PIPELINE_RUN: log.metrics_since(0, run_id=PIPELINE_RUN)})
    table = model.version_table()
    assert [(v.version, v.requests) for v in table] == [(r["drafter_version"], r["requests"]) for r in report] \
        == [(row[0], row[1]) for row in view] == [(0, 40), (1, 40), (2, 40), (3, 40)]
    for v, r, row in zip(table, report, view):
        assert v.per_request and v.tau == pytest.approx(r["tau"]) == pytest.approx(row[2])
        assert v.tau_tokens == pytest.approx(r["tau_tokens"]) == pytest.approx(row[3])


def test_a_run_without_per_request_records_falls_back_to_flush_windows_as_pipeline_status_does() -> None:
    model = MonitorModel("r")
    rows = [{"id": i + 1, "run_id": "r", "job": "inference", "step": i, "version": 0, "name": name, "value": value,
             "time": float(i)} for i, (name, value) in enumerate([("drafter_version", 0), ("tau", 2.0)])]
    model.ingest("r", {"r": ""}, {"r": rows})
    (v,) = model.version_table()
    assert not v.per_request and v.tau == 2.0 and v.requests == 0


def test_a_benchmark_matrix_plots_one_series_per_method(tmp_path: Path) -> None:
    log = RunLog.open(tmp_path / "ws")
    matrix = log.create_run("bench-matrix", name="matrix")
    for method, tau in (("vanilla", 1.0), ("adaflash", 3.2)):
        server = log.create_run("serve", method=method, parent_id=matrix)
        log.log_metrics(server, {"avg_spec_accept_length": tau, "gen_throughput": 40 * tau}, job="server")
    batch = Backend(tmp_path / "ws").metrics(matrix, {})
    model = MonitorModel(matrix)
    model.ingest(matrix, batch.sources, batch.rows, batch.statuses)
    (_, tau_names, _) = CHARTS[0]
    lines = {label: ys for label, _, ys in model.chart(tau_names)}
    assert lines == {"adaflash:avg_spec_accept_length": [3.2], "vanilla:avg_spec_accept_length": [1.0]}


def test_generation_speed_is_plotted_from_the_progress_records_before_the_first_flush() -> None:
    model = MonitorModel("r")
    rows = [{"id": i + 1, "run_id": "r", "job": "inference", "step": 0, "version": None, "name": "tokens_so_far",
             "value": tokens, "time": 100.0 + i} for i, tokens in enumerate((0.0, 50.0, 120.0))]
    model.ingest("r", {"r": ""}, {"r": rows})
    (_, names, _) = CHARTS[1]
    assert [(label, ys) for label, _, ys in model.chart(names)] == [("live_tokens_per_s", [50.0, 70.0])]


async def test_the_monitor_shows_requests_per_version_and_speed_at_once(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    log = RunLog.open(ws)
    run_id = log.create_run("pipeline")
    for tokens in (0, 40, 90):  # the first seconds: no answer flushed yet
        log.log_metrics(run_id, {"prompts_in_flight": 8, "tokens_so_far": tokens, "answers_so_far": 0}, step=0,
                        job="inference")
    with log._write() as conn:  # spread the progress records a second apart, as the worker writes them
        conn.execute("UPDATE metrics SET time = 1000 + id WHERE run_id = ?", [run_id])
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=run_id, tab="monitor")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "live_tokens_per_s" in text and "tok/s: generation ◂ · ▸ training: no data yet" not in text
    fill_runlog(tmp_path / "ws2")
    app = make_app(tmp_path / "ws2", inventory=FakeInventory(available=False), live=False, run_id=PIPELINE_RUN,
                   tab="monitor")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "requests" in text and "mean per request" in text


async def test_the_monitor_plots_tau_from_the_first_answer(tmp_path: Path) -> None:
    """The inference worker flushes its first answer at once; the τ chart draws that single point."""
    ws = tmp_path / "ws"
    log = RunLog.open(ws)
    run_id = log.create_run("pipeline")
    log.log_metrics(run_id, {"prompts_in_flight": 8, "tokens_so_far": 40, "answers_so_far": 0}, step=0, job="inference")
    log.log_metrics(run_id, {"tau": 2.5, "drafter_version": 0, "samples": 1}, step=1, version=0, job="inference")
    log.log_metrics(run_id, {"served_requests": 1, "served_tau_sum": 2.5, "served_tokens": 10, "served_verify": 4},
                    version=0, job="inference")
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=run_id, tab="monitor")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        monitor = app.pane("monitor")
        (_, names, _) = CHARTS[0]
        assert [ys for _, _, ys in monitor.model.chart(names)] == [[2.5]]
        text = screen_text(app)
        assert "acceptance length τ: no data yet" not in text and "with the first answer" not in text
        assert [(v.version, v.requests, v.tau) for v in monitor.model.version_table()] == [(0, 1, 2.5)]
