"""What a tester met at 80×24 and 140×45 in tmux: text cut mid-word, columns cut at the edge or shrinking
while a filter was typed, form fields of another mode, toggles whose state only colour told, Tab stops
with no visible focus, and a ready server's row without its URL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.widgets import Input

from adaflash.runlog import RunLog
from tests.test_tui_fixtures import RECIPE_RUN, FakeInventory, fill_runlog, screen_text, settle
from tests.test_tui_flows import make_app
from tui.widgets import Check, Checklist, Radio

NARROW, WIDE = (80, 24), (160, 50)


@pytest.fixture()
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ADAFLASH_LEASES", str(tmp_path / "leases.json"))
    path = tmp_path / "ws"
    path.mkdir()
    monkeypatch.setenv("ADAFLASH_WORKSPACE", str(path))
    return path


async def test_nothing_is_cut_mid_word_at_80x24_and_more_shows_at_160x50(ws: Path) -> None:
    log = fill_runlog(ws)
    failed = f"step 3/3: job bench failed: exit code 1; log: {ws}/runs/{RECIPE_RUN}/adaflash-bench.log"
    log.update_run(RECIPE_RUN, note=failed)
    for size in (NARROW, WIDE):
        app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=RECIPE_RUN, tab="jobs")
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            text = screen_text(app)
            assert "adaflash-bench.log" in "".join(line.strip() for line in text.splitlines())  # the note, whole
            assert "log · prepare · runs/" in text  # the log title: the path inside the workspace
            await pilot.press("6")
            await settle(pilot)
            text = screen_text(app)
            assert not re.search(r"\b20\d\d-(?!\d\d-\d\d \d\d:\d\d)", text), text  # a date is whole or absent
            table = app.query_one("#runs-table")
            assert ("created" in table.shown_keys) == (size == WIDE)
            await pilot.press("5")
            await settle(pilot)
            bar = screen_text(app).splitlines()[3]
            assert re.search(r"/ filter: text or key=value\s{2,}8 rows", bar), bar


async def test_compare_columns_hold_still_while_a_filter_is_typed(ws: Path) -> None:
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, tab="compare")
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        table = app.query_one("#compare-table")
        widths = [c.get_render_width(table) for c in table.ordered_columns]
        await pilot.press("slash", *"zz")  # nothing matches...
        await pilot.pause()
        assert [c.get_render_width(table) for c in table.ordered_columns] == widths
        await pilot.press("backspace", "backspace", *"ada")  # ...then some rows again
        await pilot.pause()
        assert [c.get_render_width(table) for c in table.ordered_columns] == widths
        assert len(app.pane("compare").shown) == 3 and " adaflash " in screen_text(app)


async def test_the_form_shows_only_the_fields_and_hints_of_its_mode(ws: Path) -> None:
    app = make_app(ws, inventory=FakeInventory(2), live=False, tab="launch")
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        dataset, draft = app.query_one("#dataset", Input), app.query_one("#draft", Input)
        await pilot.click("#mode-pipeline")
        await settle(pilot)
        assert dataset.is_on_screen and "bench" not in draft.placeholder + dataset.placeholder
        assert "method=" not in draft.placeholder + dataset.placeholder
        await pilot.click("#mode-server")
        await settle(pilot)
        assert not dataset.is_on_screen and draft.is_on_screen
        assert "learn its traffic (--adapt)" in screen_text(app)  # its label whole at 80 columns
        await pilot.click("#mode-bench")
        await settle(pilot)
        assert dataset.is_on_screen and "method=DIR" in draft.placeholder


async def test_toggles_draw_a_different_glyph_on_and_off(ws: Path) -> None:
    app = make_app(ws, inventory=FakeInventory(2), live=False, tab="launch")
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        on, off = app.query_one("#mode-recipe", Radio), app.query_one("#mode-pipeline", Radio)
        assert (on.value, off.value) == (True, False)
        assert str(on.render())[:3] == "▐●▌" and str(off.render())[:3] == "▐ ▌"
        share = app.query_one("#share", Check)
        glyphs = []
        for value in (False, True):
            share.value = value
            await pilot.pause()
            glyphs.append(str(share.render())[:3])
        assert glyphs == ["▐ ▌", "▐✓▌"]
        methods = app.query_one("#bench-methods", Checklist)
        await pilot.click("#mode-bench")
        await settle(pilot)
        lines = ["".join(s.text for s in methods.render_line(y)) for y in range(len(methods.options))]
        assert lines[0].startswith("▐✓▌ Vanilla") and lines[3].startswith("▐ ▌ EAGLE-3"), lines


def _look(widget) -> list:
    """The widget and what it holds, as drawn (text and styles)."""
    return [[(seg.text, str(seg.style)) for line in part.render_lines(part.region.reset_offset) for seg in line]
            for part in [widget, *widget.query("*")] if part.display and part.region.area]


async def test_every_tab_stop_shows_its_focus(ws: Path) -> None:
    """Two Tab stops showed no focus, and a focused input only its blinking cursor."""
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(2), live=False, run_id=RECIPE_RUN)
    async with app.run_test(size=WIDE) as pilot:
        await settle(pilot)
        seen = []
        for tab, mode in [("gpus", None), *(("launch", m) for m in ("recipe", "pipeline", "server", "bench")),
                          ("jobs", None), ("monitor", None), ("compare", None), ("history", None)]:
            app.show_tab(tab)
            await settle(pilot)
            if mode:
                await pilot.click(f"#mode-{mode}")
                await settle(pilot)
            pane = app.pane(tab)
            for widget in [w for w in pane.query("*") if w.focusable and w.region.area]:
                app.screen.set_focus(None)
                await pilot.pause()
                blurred = _look(widget)
                widget.focus()
                await pilot.pause()
                assert _look(widget) != blurred, f"{tab}: {widget!r} looks the same focused"
                seen.append(widget.id)
        assert {"mode", "preset", "adapt", "bench-methods", "dataset", "plan-box", "launch-button"} <= set(seen)


async def test_a_ready_servers_row_shows_where_it_answers(ws: Path) -> None:
    log = RunLog.open(ws)
    config = {"jobs": {"serve_dflash": {"ready": {"http": "http://127.0.0.1:31000/health"}, "kind": "service"}}}
    run_id = log.create_run("recipe", name="tui-serve-dflash", config=config, run_dir=str(ws / "runs" / "r"))
    job = log.add_job(run_id, "serve_dflash", ["adaflash", "serve"], role="server", status="ready")
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=run_id, tab="jobs")
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        assert "http://127.0.0.1:31000" in screen_text(app) and "serves at" in screen_text(app)
    log.update_job(job, status="stopped")
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=run_id, tab="jobs")
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        assert "http://127.0.0.1:31000" not in screen_text(app)  # a stopped server answers nowhere
