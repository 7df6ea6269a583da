"""What users of nvitop, k9s and Harlequin expect: a log that holds still on request, searched and
jumped to its first error; a past run loaded back into the Launch form."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input, Log

from tests.test_tui_fixtures import RECIPE_RUN, FakeInventory, fill_runlog, screen_text, settle
from tests.test_tui_flows import SIZE, make_app
from tui.logview import LogView


async def test_the_log_follows_or_holds_is_searched_and_jumps_to_its_first_error(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    fill_runlog(ws)
    bench_log = ws / "runs" / RECIPE_RUN / "bench.log"
    bench_log.write_text("".join(f"step {i}: ok\n" for i in range(200)) + "Traceback (most recent call last):\n"
                         + "".join(f"after {i}\n" for i in range(50)))
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=RECIPE_RUN, tab="jobs")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        jobs = app.pane("jobs")
        table = app.query_one("#jobs-table")
        table.focus()
        table.move_cursor(row=2)  # the bench job
        await settle(pilot)
        log = app.query_one("#job-log", Log)
        assert log.auto_scroll and "Traceback" not in screen_text(app)
        await pilot.press("e")
        await pilot.pause()
        assert jobs.log_line == 200 and not log.auto_scroll and "Traceback" in screen_text(app)
        assert "held: f follows" in screen_text(app)
        await pilot.press("f")  # follow again: the end
        await pilot.pause()
        assert log.auto_scroll and "after 49" in screen_text(app)
        await pilot.press("slash")
        assert app.focused is app.query_one("#log-search", Input)
        await pilot.press(*"step 17", "enter")
        await pilot.pause()
        assert jobs.log_line == 17 and "step 17: ok" in screen_text(app)
        assert app.focused is table and app.query_one("#log-search").has_class("hidden")  # n/N go on from here
        assert "/step 17: 1/11 n/N" in screen_text(app)
        await pilot.press("n")  # the next match
        await pilot.pause()
        assert jobs.log_line == 170 and log.current == 170
        await pilot.press("N", "N")  # back, then round to the last
        await pilot.pause()
        assert jobs.log_line == 179
        await pilot.press("slash")
        assert app.query_one("#log-search", Input).value == "step 17"
        await pilot.press("escape")  # leaves the search and clears it
        await pilot.pause()
        assert app.focused is table and app.query_one("#log-search").has_class("hidden")
        assert jobs.needle == "" and not log.highlight


async def test_search_highlights_every_match_and_wrap_folds_long_lines(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    fill_runlog(ws)
    bench_log = ws / "runs" / RECIPE_RUN / "bench.log"
    bench_log.write_text("short\n" + "x" * 150 + " needle at the end\n" + "".join(f"line {i}\n" for i in range(5)))
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=RECIPE_RUN, tab="jobs")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one("#jobs-table")
        table.focus()
        table.move_cursor(row=2)
        await settle(pilot)
        log = app.query_one("#job-log", LogView)
        assert "needle at the end" not in screen_text(app)  # cut at the width
        await pilot.press("w")
        await pilot.pause()
        text = screen_text(app)
        assert log.wrap and "e at the end" in text and "[wrap]" in text and "line 4" in text
        assert log.virtual_size.height > log.line_count  # the long line takes several rows
        await pilot.press("slash", *"needle", "enter")
        await pilot.pause()
        assert app.pane("jobs").log_line == 1 and log.current == 1
        strip = log.render_line(log.row_of(1) + 1 - int(log.scroll_y))  # the row holding "needle"
        assert any(seg.text.lower().startswith("needle") and seg.style and seg.style.bgcolor for seg in strip)
        await pilot.press("w")
        await pilot.pause()
        assert not log.wrap and log.virtual_size.height == log.line_count


async def test_a_past_recipe_run_loads_into_the_launch_form(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ADAFLASH_LEASES", str(tmp_path / "leases.json"))
    ws = tmp_path / "ws"
    log = fill_runlog(ws)
    recipe = ws / "recipes" / "mine.toml"
    recipe.parent.mkdir()
    recipe.write_text('[run]\nname = "mine"\n\n[jobs.hello]\ncommand = ["python", "-c", "print(1)"]\n')
    run_id = log.create_run("recipe", name="mine", config={"path": str(recipe), "jobs": {}}, status="finished")
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, tab="history")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        history = app.pane("history")
        table = app.query_one("#runs-table")
        table.focus()
        table.move_cursor(row=[r["id"] for r in history.shown].index(run_id))
        await pilot.press("l")
        await settle(pilot)
        launch = app.pane("launch")
        assert app.active_tab == "launch" and launch.mode == "recipe"
        assert app.query_one("#recipe-path", Input).value == str(recipe)
        assert launch.errors == [] and "ready to launch" in screen_text(app)
        app.show_tab("history")
        await settle(pilot)
        table.move_cursor(row=[r["id"] for r in history.shown].index(RECIPE_RUN))  # no recipe file recorded
        await pilot.press("l")
        await pilot.pause()
        assert app.active_tab == "history"
        assert any("not started from a recipe file" in n.message for n in app._notifications)


async def test_a_following_log_keeps_to_its_end_when_it_shrinks() -> None:
    """A log laid out tall first (no scrolling) and then shrunk still shows its end while it follows, and
    keeps its place when held: the jobs pane's first layout can come in either order."""
    from textual.app import App, ComposeResult

    class OneLog(App):
        def compose(self) -> ComposeResult:
            yield LogView(id="log")

    app = OneLog()
    async with app.run_test(size=(60, 120)) as pilot:
        log = app.query_one(LogView)
        log.write("".join(f"line {i}\n" for i in range(100)))
        await pilot.pause()
        assert log.max_scroll_y == 0
        await pilot.resize_terminal(60, 20)
        await pilot.pause()
        assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y
        log.auto_scroll = False
        log.scroll_to(y=3, animate=False, immediate=True)
        await pilot.resize_terminal(60, 16)
        await pilot.pause()
        assert log.scroll_y == 3
