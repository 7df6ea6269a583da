"""The Query tab (Harlequin-style): read-only SQL over the run log, the views as starting points,
errors inline, and the rows exported to CSV or Markdown in the workspace."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable, OptionList, TextArea

from tests.test_tui_fixtures import PIPELINE_RUN, FakeInventory, fill_runlog, screen_text, settle, wait_for
from tests.test_tui_flows import SIZE, make_app
from tui.sqlquery import run_query, sources


def test_the_run_log_opens_read_only_and_lists_its_views_first(tmp_path: Path) -> None:
    log = fill_runlog(tmp_path / "ws")
    path = Path(log.path)
    found = sources(path)
    assert found[0].kind == "view" and "tau_per_version" in [s.name for s in found if s.kind == "view"]
    assert "runs" in [s.name for s in found if s.kind == "table"]
    refused = run_query(path, "DELETE FROM runs")
    assert refused.error and "readonly" in refused.error.replace(" ", "").lower()
    assert len(run_query(path, "SELECT * FROM runs").rows) == 5  # nothing deleted
    two = run_query(path, "SELECT 1; SELECT 2")
    assert two.error  # one statement at a time
    capped = run_query(path, "SELECT * FROM metrics", limit=10)
    assert len(capped.rows) == 10 and capped.truncated
    missing = run_query(tmp_path / "nowhere" / "runlog.sqlite", "SELECT 1")
    assert missing.error and not (tmp_path / "nowhere").exists()  # never a new empty database


async def test_pick_a_view_run_sql_see_errors_inline_and_export(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, tab="query")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        pane = app.pane("query")
        box = app.query_one("#query-sources", OptionList)
        await wait_for(pilot, lambda: box.option_count > 0, 10, "the views")
        assert app.focused is box
        box.highlighted = [s.name for s in pane.sources].index("tau_per_version")
        await pilot.press("enter")
        await wait_for(pilot, lambda: pane.result is not None, 10, "the view's rows")
        assert 'FROM "tau_per_version"' in app.query_one("#query-editor", TextArea).text
        assert "tau" in pane.result.columns and len(pane.result.rows) == 4
        assert app.query_one("#query-results", DataTable).row_count == 4
        assert "4 row(s)" in screen_text(app)
        editor = app.query_one("#query-editor", TextArea)
        await pilot.press("f4")
        assert app.focused is editor
        editor.text = "SELEC nonsense"
        await pilot.press("f5")
        await wait_for(pilot, lambda: "✗" in screen_text(app), 10, "the error")
        assert "syntax error" in screen_text(app)
        assert app.query_one("#query-results", DataTable).row_count == 4  # the last good rows stay
        editor.text = f"SELECT name, value FROM metrics WHERE run_id = '{PIPELINE_RUN}' LIMIT 3"
        await pilot.press("f5")
        await wait_for(pilot, lambda: pane.result.columns == ["name", "value"], 10, "the rows")
        await pilot.press("escape")  # out of the editor: keys are the app's again
        assert app.focused is box
        await pilot.press("f6")
        await wait_for(pilot, lambda: list((ws / "exports").glob("query-*.csv")), 10, "the CSV")
        (csv_file,) = (ws / "exports").glob("query-*.csv")
        assert csv_file.read_text().splitlines()[0] == "name,value" and len(csv_file.read_text().splitlines()) == 4
        assert any(str(csv_file) in n.message for n in app._notifications)
        await pilot.press("f7")
        await wait_for(pilot, lambda: list((ws / "exports").glob("query-*.md")), 10, "the Markdown")
        (md_file,) = (ws / "exports").glob("query-*.md")
        assert "| name | value |" in md_file.read_text()
