"""adaflash-tui flows driven with App.run_test() + Pilot: every screen on an empty workspace,
assign -> launch a real short CPU job -> Jobs -> Monitor -> stop with confirmation, the quit
question with runs still going, Compare (sort, filter, export), History (filter, open, compare),
inline launch errors, the palette and the help generated from the registry."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
from textual.pilot import Pilot
from textual.widgets import Checkbox, DataTable, Input, Select

from adaflash.runlog import RunLog
from jobs.control import LIVE_RUN_STATUSES, stop_run, supervisor_pid
from jobs.detached import launch_detached
from tests.test_tui_fixtures import (
    GENERATE_RUN,
    MATRIX_RUN,
    PIPELINE_RUN,
    RECIPE_RUN,
    SERVE_RUN,
    FakeInventory,
    fake_pipeline_recipe,
    fill_runlog,
    screen_text,
    settle,
    tiny_recipe,
    wait_for,
)
from tui.actions import REGISTRY, TABS
from tui.app import AdaflashApp
from tui.modals import ConfirmScreen, HelpScreen, QuitScreen

SIZE = (80, 24)  # the smallest terminal the TUI is designed for


@pytest.fixture()
def leases(tmp_path, monkeypatch) -> Path:
    """GPU leases of the fake GPUs go to a private file, never the user's."""
    path = tmp_path / "leases.json"
    monkeypatch.setenv("ADAFLASH_LEASES", str(path))
    return path


@pytest.fixture()
def ws(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    monkeypatch.setenv("ADAFLASH_WORKSPACE", str(path))
    return path


def make_app(workspace: Path, **kwargs) -> AdaflashApp:
    app = AdaflashApp(workspace, **kwargs)
    app.animation_level = "none"  # tests wait for what happened, never for tab underline slides
    return app


async def click_cell(pilot: Pilot, table: DataTable, row: int, column: int) -> None:
    """Click a DataTable cell where it is on screen now: after any scroll the last click started (a
    click moves the cursor, and the table scrolls it into view with an animation) and net of the
    table's scroll offsets, and once the pointer hovers that very cell. (Clicks computed without these
    toggled the next column twice, in CI runs with the machine loaded.)"""
    for _ in range(50):
        await pilot.wait_for_scheduled_animations()
        x = sum(c.get_render_width(table) for c in table.ordered_columns[:column]) + 2 - int(table.scroll_x)
        y = row + (1 if table.show_header else 0) - int(table.scroll_y)
        await pilot.hover(table, offset=(x, y))
        await pilot.pause()
        if table.hover_coordinate == (row, column):  # the pointer is on the cell as rendered now
            await pilot.click(table, offset=(x, y))
            return
        await pilot.pause(0.05)
    raise AssertionError(f"the pointer never rested on cell ({row}, {column}) of #{table.id}")


async def fill_launch_form(pilot: Pilot, click: str, fields: dict[str, str]):
    """Open the Launch tab (key 2), click `click` (a mode, a field), type `fields` (widget id → value) into
    their inputs, let the plan follow; the Launch pane."""
    await pilot.press("2")
    await pilot.click(click)
    await settle(pilot)
    for widget, value in fields.items():
        pilot.app.query_one(widget, Input).value = value
    await settle(pilot)
    return pilot.app.pane("launch")


def stop_leftovers(workspace: Path) -> None:
    """A failed test must not leave detached runs behind."""
    log = RunLog.open(workspace)
    for run in log.list_runs():
        if run["status"] in LIVE_RUN_STATUSES:
            stop_run(log, run["id"], grace=1.0, wait=10.0)


async def test_empty_workspace_renders_every_screen(ws: Path) -> None:
    app = make_app(ws, inventory=FakeInventory(available=False), live=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "No usable NVIDIA GPU" in text and "Use CPU workers" in text and "Host" in text
        expected = {"gpus": "CPU workers", "launch": "GPUs → roles", "jobs": "No run yet",
                    "monitor": "No run yet", "compare": "No benchmark results yet", "history": "No runs", "procs": "No run yet",
                    "query": "views, tables"}
        for tab, _, key in TABS:
            await pilot.press(key)
            await settle(pilot)
            assert app.active_tab == tab
            assert expected[tab] in screen_text(app), tab
        # the help lists the registry; the palette runs a tab's command from anywhere
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert app.screen.query_one("#help-table", DataTable).row_count == len(REGISTRY)
        await pilot.press("escape")
        # one Quit in the palette: the registry's (it asks about running jobs), not Textual's too
        assert "Quit" not in [c.title for c in app.get_system_commands(app.screen)]
        assert "Theme" in [c.title for c in app.get_system_commands(app.screen)]
        launch = app.pane("launch")
        launch.method_roles["training"] = (0,)
        await pilot.press("ctrl+p")
        await pilot.pause()
        app.screen.query_one(Input).insert_text_at_cursor("every role on CPU")
        await wait_for(pilot, lambda: "Put every role on CPU" in screen_text(app), 10, "the palette hit")
        await pilot.press("enter")
        await settle(pilot)
        assert app.active_tab == "launch" and launch.method_roles["training"] is None
        await pilot.press("1", "c")  # the no-GPU offer: every role on CPU workers, in Launch
        await settle(pilot)
        assert app.active_tab == "launch"
        assert all(gpus is None for gpus in launch.method_roles.values())
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_assign_launch_monitor_and_stop_a_real_cpu_job(ws: Path, leases: Path) -> None:
    recipe = tiny_recipe(ws / "tiny.toml")
    app = make_app(ws, inventory=FakeInventory(2), live=True, interval_scale=0.2)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            launch = await fill_launch_form(pilot, "#recipe-path", {"#recipe-path": str(recipe)})
            await wait_for(pilot, lambda: launch.recipe_roles == {"inference": None}, 10, "the recipe's roles")
            assert launch.errors == []
            # assign: the grid cell (inference, GPU 1) with the keyboard...
            grid = app.query_one("#assign", DataTable)
            await pilot.press("ctrl+g")
            assert grid.has_focus and grid.cursor_coordinate == (0, 1)  # inference × GPU 0
            await pilot.press("right", "space")
            await settle(pilot)
            assert launch.assignment()["inference"] == (1,)
            # ...and with the mouse: GPU 0 too, then off again
            await click_cell(pilot, grid, 0, 1)
            await settle(pilot)
            assert launch.assignment()["inference"] == (0, 1)
            await click_cell(pilot, grid, 0, 1)
            await settle(pilot)
            assert launch.assignment()["inference"] == (1,)
            assert launch.errors == []
            plan = launch.plan.plan_text
            assert "CUDA_VISIBLE_DEVICES='1'" in plan and "-c" in plan and "tiny" in plan
            assert "gpus.inference=[1]" in launch.plan.overrides
            planned_id = launch.plan.run_id
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: app.launched, 30, "the launch")
            run_id = app.launched[0]
            assert run_id == planned_id  # the command lines shown are the ones started
            assert app.active_tab == "jobs" and app.current_run_id == run_id
            jobs = app.pane("jobs")
            await wait_for(pilot, lambda: any(r.job.get("status") == "running" for r in jobs.rows.values()), 30,
                           "the job running")
            row = next(iter(jobs.rows.values()))
            assert row.name == "worker" and row.job["gpus"] == "1"
            assert "supervisor" in screen_text(app) and "alive" in screen_text(app)
            await wait_for(pilot, lambda: "tiny job ready" in "\n".join(app.query_one("#job-log").lines), 30,
                           "the log tail")
            monitor = app.pane("monitor")
            await wait_for(pilot, lambda: monitor.model.series.get(("", "tau")) is not None
                           and monitor.model.series[("", "tau")].count == 5, 30, "the metrics")
            await pilot.press("4")
            await settle(pilot)
            text = screen_text(app)
            assert "acceptance length τ" in text and "tokens_per_s" in text
            assert [v.version for v in monitor.model.version_table()] == [0, 1, 2]
            # restart, then stop, each with the confirmation
            await pilot.press("3")
            await settle(pilot)
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
            await pilot.press("y")
            await wait_for(pilot, lambda: next(iter(jobs.rows.values())).job.get("restarts") == 1
                           and next(iter(jobs.rows.values())).job.get("status") == "running", 30, "the restart")
            await pilot.press("s")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
            await pilot.press("n")  # cancelled: nothing happens
            await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 10, "the dialog closed")
            assert any(r.job["status"] == "running" for r in jobs.rows.values())
            await pilot.press("s")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
            await pilot.press("y")
            await wait_for(pilot, lambda: jobs.state is not None and jobs.state.run["status"] == "stopped", 30,
                           "the run stopped")
            assert next(iter(jobs.rows.values())).job["status"] == "stopped"
            # the background supervisor this app started is reaped once it exits, not left a zombie
            await wait_for(pilot, lambda: not [c for c in psutil.Process().children()
                                               if c.status() == psutil.STATUS_ZOMBIE], 30, "no zombie child")
            await pilot.press("q")  # nothing runs any more: quits at once
            await pilot.pause()
        assert app.return_code == 0
    finally:
        stop_leftovers(ws)


async def test_quit_while_running_asks_then_leaves_or_stops(ws: Path) -> None:
    recipe = tiny_recipe(ws / "tiny.toml")
    run_id = launch_detached(recipe, workspace=ws)
    try:
        app = make_app(ws, inventory=FakeInventory(available=False), live=False)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert app.current_run_id == run_id  # the live run is picked up at start
            await pilot.press("q")
            await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen), 10, "the quit question")
            assert run_id in screen_text(app)
            await pilot.press("escape")  # cancel: still here
            await wait_for(pilot, lambda: not isinstance(app.screen, QuitScreen), 10, "the dialog closed")
            assert app.is_running
            await pilot.press("q")
            await settle(pilot)
            await pilot.press("l")  # leave it running
            await pilot.pause()
        log = RunLog.open(ws)
        assert log.get_run(run_id)["status"] == "running"
        assert supervisor_pid(log.get_run(run_id)) is not None

        # the next start shows it again; quitting can stop it
        app = make_app(ws, inventory=FakeInventory(available=False), live=False)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert app.current_run_id == run_id
            await pilot.press("3")
            await settle(pilot)
            assert "worker" in screen_text(app)
            await pilot.press("q")
            await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen), 10, "the quit question")
            await pilot.press("s")
            await wait_for(pilot, lambda: not app.is_running, 40, "the stop and exit")
        assert RunLog.open(ws).get_run(run_id)["status"] == "stopped"
    finally:
        stop_leftovers(ws)


async def test_compare_sort_filter_export(ws: Path) -> None:
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=RECIPE_RUN)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("5")
        await settle(pilot)
        pane = app.pane("compare")
        assert MATRIX_RUN in pane.data.source
        assert [r["method"] for r in pane.shown][:3] == ["vanilla", "dflash", "adaflash"]
        table = app.query_one("#compare-table", DataTable)
        table.focus()
        column = list(table.columns).index(next(k for k in table.columns if k.value == "speedup"))
        table.move_cursor(column=column)
        await pilot.press("s")
        await pilot.pause()
        speedups = [r["speedup"] for r in pane.shown]
        assert speedups == sorted(speedups, reverse=True) and speedups[0] == pytest.approx(2.6)
        await pilot.press("s")  # again: the other way
        await pilot.pause()
        assert [r["speedup"] for r in pane.shown] == sorted(speedups)
        await pilot.click("#compare-table", offset=(3, 0))  # a header click sorts too (method)
        await pilot.pause()
        assert pane.sort_column == "method"
        await pilot.press("slash")
        assert app.focused is app.query_one("#compare-filter")
        await pilot.press(*"dataset=")
        app.query_one("#compare-filter", Input).insert_text_at_cursor("humaneval")  # the rest, at once
        await pilot.pause()
        assert {r["dataset"] for r in pane.shown} == {"humaneval"} and len(pane.shown) == 2
        assert "2 of 8 rows" in screen_text(app)
        await pilot.press("enter", "e")
        await wait_for(pilot, lambda: pane.last_export is not None, 10, "the markdown export")
        markdown = pane.last_export.read_text()
        assert pane.last_export.parent == ws / "exports" and pane.last_export.suffix == ".md"
        assert "humaneval" in markdown and "gsm8k" not in markdown.split("\n\n")[0] and "2.32x" in markdown
        pane.last_export = None
        await pilot.press("v")
        await wait_for(pilot, lambda: pane.last_export is not None, 10, "the CSV export")
        lines = pane.last_export.read_text().splitlines()
        assert lines[0].startswith("group,run_id,method") and len(lines) == 3
        assert any(line.split(",")[2] == "adaflash" for line in lines[1:])


async def test_history_filter_open_and_compare(ws: Path) -> None:
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=MATRIX_RUN)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("6")
        await settle(pilot)
        pane = app.pane("history")
        assert [r["id"] for r in pane.shown] == [MATRIX_RUN, PIPELINE_RUN, RECIPE_RUN, SERVE_RUN, GENERATE_RUN]
        app.query_one("#f-status", Select).value = "failed"
        await settle(pilot)
        assert [r["id"] for r in pane.shown] == [SERVE_RUN]
        app.query_one("#f-status", Select).clear()
        app.query_one("#f-target", Select).value = "smollm2-135m"
        app.query_one("#f-method", Select).value = "adaflash"
        await settle(pilot)
        assert [r["id"] for r in pane.shown] == [PIPELINE_RUN]
        await pilot.press("escape")
        await settle(pilot)
        assert len(pane.shown) == 5
        await pilot.press("slash", *"gen")
        app.query_one("#f-text", Input).insert_text_at_cursor("erate")
        await pilot.press("enter")
        await pilot.pause()
        assert [r["id"] for r in pane.shown] == [GENERATE_RUN]
        await pilot.press("escape")
        await settle(pilot)
        # select two runs (space), compare them: no bench results, so their latest metrics side by side
        table = app.query_one("#runs-table", DataTable)
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("space")  # the pipeline run
        await pilot.pause()
        assert pane.selected == [PIPELINE_RUN]
        await pilot.press("space")  # the recipe run (the cursor moved down)
        assert pane.selected == [PIPELINE_RUN, RECIPE_RUN]
        await pilot.press("c")
        await settle(pilot)
        assert app.active_tab == "compare"
        compare = app.pane("compare")
        assert compare.run_ids == [PIPELINE_RUN, RECIPE_RUN]
        assert [item["run"]["id"] for item in compare.data.side_by_side] == [PIPELINE_RUN, RECIPE_RUN]
        assert "tau" in screen_text(app)
        compare.focus_primary()
        await pilot.press("v")  # exports what is shown: the metrics side by side (it wrote older bench rows)
        await wait_for(pilot, lambda: compare.last_export is not None, 10, "the side-by-side export")
        lines = compare.last_export.read_text().splitlines()
        assert lines[0] == f"metric,{PIPELINE_RUN},{RECIPE_RUN}" and any(line.startswith("tau,") for line in lines)
        # open one: Jobs and Monitor follow it
        await pilot.press("6")
        await settle(pilot)
        table.move_cursor(row=2)
        await pilot.press("o")
        await settle(pilot)
        assert app.current_run_id == RECIPE_RUN and app.active_tab == "jobs"
        assert "pipeline › inference" in screen_text(app)
        assert app.pane("monitor").model.rows_seen == 440
        # the palette knows the runs too (context: what History read)
        await pilot.press("ctrl+p")
        await pilot.pause()
        app.screen.query_one(Input).insert_text_at_cursor(f"open run {SERVE_RUN}")
        await wait_for(pilot, lambda: "Open run " + SERVE_RUN in screen_text(app), 10, "the palette hit")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.current_run_id == SERVE_RUN, 10, "the run opened")


async def test_launch_shows_invalid_choices_inline_and_refuses(ws: Path, leases: Path) -> None:
    app = make_app(ws, inventory=FakeInventory(2), live=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("2")
        await settle(pilot)
        launch = app.pane("launch")
        await pilot.click("#mode-pipeline")
        await settle(pilot)
        assert launch.mode == "pipeline"
        assert any("dataset: required" in e for e in launch.errors)
        assert "✗ dataset: required" in screen_text(app)
        await pilot.press("ctrl+l")  # refused, and no crash
        await pilot.pause()
        assert app.launched == [] and RunLog.open(ws).list_runs() == []
        app.query_one("#draft", Input).value = "drafters/none"
        app.query_one("#dataset", Input).value = "data/none.jsonl"
        app.query_one("#max-samples", Input).value = "many"
        await settle(pilot)
        # what is not there now fails the job at its start: refused too (nothing runs before it)
        assert launch.errors == ["max samples: expected an integer, got 'many'",
                                 "drafter 'drafters/none': no such file or folder (the job would fail at its start)",
                                 "dataset 'data/none.jsonl': no such file (the job would exit 2)"]
        (ws / "drafter").mkdir()
        (ws / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
        app.query_one("#draft", Input).value = str(ws / "drafter")
        app.query_one("#dataset", Input).value = str(ws / "prompts.jsonl")
        app.query_one("#max-samples", Input).value = "8"
        await settle(pilot)
        assert launch.errors == [] and "ready to launch" in screen_text(app)
        assert "--infer-gpus 0 --train-gpus 1" in launch.plan.plan_text.replace("\n", " ")
        # training onto GPU 0 as well: a conflict with inference unless they may share
        launch.toggle("training", "0")
        await settle(pilot)
        assert any("GPU 0 is given to" in e for e in launch.errors)
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert launch.errors == []
        # a role with no GPU at all
        launch.toggle("inference", "0")
        await settle(pilot)
        assert any("has no GPU" in e for e in launch.errors)
        # a server: the port must be a port
        await pilot.click("#mode-server")
        app.query_one("#port", Input).value = "99999"
        await settle(pilot)
        assert any(e.startswith("port:") for e in launch.errors)
        # a server that learns its traffic: its trainer takes the training role; vanilla cannot learn
        app.query_one("#port", Input).value = "31000"
        app.query_one("#adapt", Checkbox).value = True
        await settle(pilot)
        assert "training" in launch.used_roles()
        assert any(e.startswith("learn the traffic") for e in launch.errors)
        app.query_one("#adapt", Checkbox).value = False
        # an override that is not one, a GPU the machine lacks
        await pilot.click("#mode-recipe")
        app.query_one("#recipe-sets", Input).value = "oops"
        await settle(pilot)
        assert any("expected KEY.PATH=VALUE" in e for e in launch.errors)
        app.query_one("#recipe-sets", Input).value = "gpus.training=[7]"
        await settle(pilot)
        assert any("GPU 7 does not exist" in e for e in launch.errors)
        assert "GPU 7?" in screen_text(app)  # the grid marks the unknown GPU
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.launched == [] and RunLog.open(ws).list_runs() == []


def test_main_parses_workspace_and_env(tmp_path, monkeypatch) -> None:
    from tui import app as app_module

    seen = {}

    def fake_run(self):
        seen["workspace"] = self.workspace
        seen["run"] = self._initial_run

    monkeypatch.setattr(app_module.AdaflashApp, "run", fake_run)
    (tmp_path / "a").mkdir()
    app_module.main(["--workspace", str(tmp_path / "a")])
    assert seen == {"workspace": (tmp_path / "a").resolve(), "run": None}
    monkeypatch.setenv("ADAFLASH_WORKSPACE", str(tmp_path / "b"))
    app_module.main([])
    assert seen["workspace"] == (tmp_path / "b").resolve() and (tmp_path / "b").is_dir()


def test_main_refuses_a_mistyped_workspace_and_an_unknown_run(tmp_path, monkeypatch, capsys) -> None:
    """A mistyped --workspace became a new, empty workspace; `--run ID` opened the GPUs tab."""
    from tui import app as app_module

    seen = {}

    def fake_run(self):
        seen.update(workspace=self.workspace, run=self._initial_run, tab=self._initial_tab)

    monkeypatch.setattr(app_module.AdaflashApp, "run", fake_run)
    typo = tmp_path / "wrokspace"
    with pytest.raises(SystemExit) as exit_info:
        app_module.main(["--workspace", str(typo)])
    assert exit_info.value.code == 2 and not typo.exists() and seen == {}
    assert f"--workspace {typo}: no such folder" in capsys.readouterr().err
    ws = tmp_path / "ws"
    fill_runlog(ws).close()
    app_module.main(["--workspace", str(ws), "--run", PIPELINE_RUN[:22]])  # a unique prefix
    assert seen == {"workspace": ws.resolve(), "run": PIPELINE_RUN, "tab": "jobs"}
    app_module.main(["--workspace", str(ws), "--run", SERVE_RUN, "--tab", "monitor"])
    assert seen["run"] == SERVE_RUN and seen["tab"] == "monitor"
    with pytest.raises(SystemExit) as exit_info:
        app_module.main(["--workspace", str(ws), "--run", "2099"])
    assert exit_info.value.code == 2 and "no run '2099'" in capsys.readouterr().err


def test_tui_never_imports_torch() -> None:
    import subprocess
    import sys

    code = "import sys, tui.app, tui.bench_tui; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.strip() == "False"



async def test_switching_tab_away_from_a_focused_widget_stays_on_the_new_tab(ws: Path) -> None:
    """Textual hands a hidden focused widget's focus to a sibling and shows its tab again: not here."""
    app = make_app(ws, inventory=FakeInventory(1), live=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.show_tab("launch")
        await settle(pilot)
        grid = app.query_one("#assign", DataTable)
        grid.focus()
        await settle(pilot)
        assert app.active_tab == "launch" and grid.has_focus
        # the new pane may not be there to take focus yet (it mounts lazily): the grid keeps it
        app._focus_pane = lambda tab: None
        for tab in ("jobs", "monitor", "launch", "compare"):
            app.show_tab(tab)
            await settle(pilot)
            assert app.active_tab == tab


async def test_reload_while_a_read_is_in_flight_keeps_the_whole_history(ws: Path) -> None:
    """A read begun before ctrl+o carries the old cursors: landing in the fresh view it moved them past
    everything older, and the Monitor showed only what the run wrote after it."""
    import threading

    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=PIPELINE_RUN)
    release, blocked = threading.Event(), []
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("4")
        await settle(pilot)
        monitor = app.pane("monitor")
        before = monitor.model.rows_seen
        assert before > 100
        read = app.backend.metrics

        def slow_once(run_id, cursors, *args):
            if not blocked:
                blocked.append(True)
                release.wait(10)
            return read(run_id, cursors, *args)

        app.backend.metrics = slow_once
        monitor.refresh_data()  # a poll: its read hangs with the cursors past every row
        await wait_for(pilot, lambda: blocked, 10, "the slow read")
        log = RunLog.open(ws)
        for step in range(3):  # the run goes on writing
            log.log_metric(PIPELINE_RUN, "tau", 2.5, step=1000 + step)
        await pilot.press("ctrl+o")
        release.set()
        await settle(pilot)
        assert monitor.model.rows_seen == before + 3


async def test_restart_on_an_ended_run_is_refused_at_once(ws: Path) -> None:
    """It used to ask for confirmation, then say to stop the run, which then had nothing to stop."""
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=PIPELINE_RUN)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot)
        app.pane("jobs").focus_primary()
        await pilot.press("r")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        messages = [n.message for n in app._notifications]
        assert any("no supervisor is left" in m and "Launch the run again" in m for m in messages), messages


async def test_history_says_when_it_lists_only_the_newest_runs_and_searches_them_all(ws: Path) -> None:
    """With more runs than it lists, History said "1000 runs" and its search missed the older ones."""
    log = RunLog.open(ws)
    needle = log.create_run("data", name="the-oldest-needle")
    log.update_run(needle, created_at=1.0)
    base = log.get_run(needle)
    log.db["runs"].insert_all([{**base, "id": f"20250101-000000-bench-{i:04x}", "name": "bulk", "kind": "bench",
                                "created_at": 100.0 + i, "config": "{}"} for i in range(1004)])
    app = make_app(ws, inventory=FakeInventory(available=False), live=False)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("6")
        await settle(pilot)
        pane = app.pane("history")
        assert len(pane.shown) == 1000 and needle not in [r["id"] for r in pane.shown]
        assert "the newest of 1,005" in screen_text(app)
        await pilot.press("slash", *"needle")
        await settle(pilot)
        assert [r["id"] for r in pane.shown] == [needle]


async def test_stop_lets_a_pipeline_finish_its_step_and_publish(ws: Path) -> None:
    """Stop killed a pipeline after its job's short grace while a training step ran: the run failed, no final
    version, rows "running" for minutes. It asks the pipeline to stop as `adaflash pipeline stop` does."""
    recipe = fake_pipeline_recipe(ws / "pipe.toml", step_seconds=1.5, stop_grace=0.5)
    run_id = launch_detached(recipe, workspace=ws)
    try:
        app = make_app(ws, inventory=FakeInventory(available=False), live=True, interval_scale=0.2, run_id=run_id)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await pilot.press("3")
            jobs = app.pane("jobs")
            await wait_for(pilot, lambda: jobs.state is not None and jobs.state.children
                           and jobs.state.children[0]["status"] == "running", 30, "the pipeline running")
            pipeline_id = jobs.state.children[0]["id"]
            jobs.focus_primary()
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
            await pilot.press("y")
            await wait_for(pilot, lambda: "stopping" in screen_text(app), 10, "the stopping note")
            await wait_for(pilot, lambda: jobs.state.run["status"] not in LIVE_RUN_STATUSES, 60, "the run's end")
            await settle(pilot)
            # the rows show the end at the next refresh, no job still "running"
            await wait_for(pilot, lambda: all(r.job["status"] != "running" for r in jobs.rows.values()), 5,
                           "the rows updated")
        log = RunLog.open(ws)
        run, pipeline = log.get_run(run_id), log.get_run(pipeline_id)
        # one word for what the user stopped, as for a server stopped by signal; the note says how it ended
        assert (run["status"], pipeline["status"]) == ("stopped", "stopped")
        assert {j["status"] for j in log.jobs(run_id) + log.jobs(pipeline_id)} == {"stopped"}
        assert run["note"].startswith("stopped by the user") and "final version published" in pipeline["note"]
        assert log.last_metrics(pipeline_id).get("published_version") is not None
    finally:
        stop_leftovers(ws)


async def test_launch_form_takes_pipeline_sizes_and_monitor_shows_progress_at_once(ws: Path, leases: Path) -> None:
    """The form offered only "samples", and a CPU pipeline showed "no data yet" for minutes."""
    log = RunLog.open(ws)
    run_id = log.create_run("pipeline")
    log.log_metrics(run_id, {"prompts_in_flight": 16, "tokens_so_far": 120, "answers_so_far": 0}, step=0,
                    job="inference")
    log.log_metrics(run_id, {"training_step": 1}, step=1, job="training")
    app = make_app(ws, inventory=FakeInventory(2), live=False, run_id=run_id)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("4")
        await settle(pilot)
        assert "16 prompts in flight · 120 tokens · 0 answers" in screen_text(app)
        assert "training: step 1" in screen_text(app)
        launch = await fill_launch_form(pilot, "#mode-pipeline", {
            "#draft": "d", "#dataset": "f.jsonl", "#max-new-tokens": "64", "#batch-size": "4", "#max-minutes": "3"})
        plan = launch.plan.plan_text.replace("\n", " ")
        assert "--max-new-tokens 64 --batch-size 4 --max-minutes 3" in plan, plan


async def test_a_port_another_process_holds_is_refused_before_launch(ws: Path, leases: Path) -> None:
    """The form accepted a busy port; the job then showed "ready" because the other server answered."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    app = make_app(ws, inventory=FakeInventory(2), live=False)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            launch = await fill_launch_form(pilot, "#mode-server", {"#port": str(port)})
            assert any(f"port {port} on 127.0.0.1 is already in use" in e for e in launch.errors), launch.errors
            await pilot.press("ctrl+l")
            await pilot.pause()
            assert app.launched == [] and RunLog.open(ws).list_runs() == []
            server.close()
            launch.replan()
            await settle(pilot)
            assert launch.errors == []
    finally:
        server.close()


async def test_focus_never_traps_keys_in_a_filter_or_the_previous_field(ws: Path) -> None:
    """Esc in a filter kept focus there; Compare kept a filter after "compare selected"; a Tab pressed before
    a new tab's first refresh was undone; tables lacked j/k and Home/End."""
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=RECIPE_RUN)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("5")
        await settle(pilot)
        compare = app.pane("compare")
        table = app.query_one("#compare-table", DataTable)
        await pilot.press("slash", *"humaneval")
        await pilot.pause()
        assert len(compare.shown) == 2
        await pilot.press("escape")
        await pilot.pause()
        assert app.query_one("#compare-filter", Input).value == "" and len(compare.shown) == 8
        assert app.focused is table
        # tables move like lists: j/k, Home/End
        await pilot.press("j", "j")
        assert table.cursor_coordinate.row == 2
        await pilot.press("k")
        assert table.cursor_coordinate.row == 1
        await pilot.press("end")
        assert table.cursor_coordinate.row == 7
        await pilot.press("home")
        assert table.cursor_coordinate.row == 0
        # History: Esc in the text filter clears it and hands the keys back to the table
        await pilot.press("6")
        await settle(pilot)
        history = app.pane("history")
        runs = app.query_one("#runs-table", DataTable)
        await pilot.press("slash", *"gen")
        await settle(pilot)
        assert [r["id"] for r in history.shown] == [GENERATE_RUN]
        await pilot.press("escape")
        await settle(pilot)
        assert app.focused is runs and app.query_one("#f-text", Input).value == "" and len(history.shown) == 5
        await pilot.press("j")
        assert runs.cursor_coordinate.row == 1
        # a filter typed in Compare does not hide the runs compared next
        await pilot.press("5", "slash", *"humaneval", "enter")
        await pilot.pause()
        assert len(compare.shown) == 2
        await pilot.press("6")
        await settle(pilot)
        runs.move_cursor(row=1)
        await pilot.press("space", "c")
        await settle(pilot)
        assert app.active_tab == "compare" and compare.run_ids == [PIPELINE_RUN]
        assert app.query_one("#compare-filter", Input).value == "" and compare.query_text == ""
        assert app.focused is table
        # the user moves focus before the new tab's first refresh: it stays where they put it
        app.show_tab("history")
        app.query_one("#f-text", Input).focus()
        await pilot.press("a", "b")
        await settle(pilot)
        assert app.query_one("#f-text", Input).value == "ab"


async def test_at_80x24_the_version_table_and_compare_keep_their_key_columns(ws: Path) -> None:
    """At 80×24 the τ-per-version table collapsed below the charts, and Compare scrolled method and dataset
    off screen as the cursor went right."""
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=PIPELINE_RUN, tab="monitor")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        lines = screen_text(app).splitlines()
        version_rows = [line for line in lines if line.lstrip("│ ").startswith(("v0 ", "v3 "))]
        assert len(version_rows) == 2 and all("2.14" in r or "3.04" in r for r in version_rows), lines  # per request
        await pilot.press("5")
        await settle(pilot)
        table = app.query_one("#compare-table", DataTable)
        table.focus()
        table.move_cursor(row=2, column=len(table.columns) - 1)
        await pilot.pause()
        assert table.scroll_x > 0  # it did scroll sideways
        row = next(line for line in screen_text(app).splitlines() if line.startswith(" adaflash "))
        assert "gsm8k" in row, row
        header = next(line for line in screen_text(app).splitlines() if line.startswith(" method "))
        assert "dataset" in header


async def test_the_job_log_opens_full_screen_and_back(ws: Path) -> None:
    """The log pane showed 5-9 lines with no full-screen view."""
    fill_runlog(ws)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, run_id=RECIPE_RUN, tab="jobs")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        log = app.query_one("#job-log")
        assert log.size.height < 10
        app.pane("jobs").focus_primary()
        await pilot.press("l")
        await settle(pilot)
        assert app.screen.maximized is log and log.size.height >= SIZE[1] - 4
        text = screen_text(app)
        assert "[prepare] step 11: ok" in text and "log · prepare" in text
        await pilot.press("escape")
        await settle(pilot)
        assert app.screen.maximized is None and log.size.height < 10
        await pilot.press("l", "l")  # l toggles back as well
        await settle(pilot)
        assert app.screen.maximized is None and app.focused is app.query_one("#jobs-table")


async def test_jobs_shows_progress_and_a_killed_pipeline_ends_at_once(ws: Path) -> None:
    """After a launch the user lands in Jobs: it shows the progress too. A pipeline run killed without
    recording its end (SIGKILL) showed "running" for good."""
    import subprocess
    import sys

    log = RunLog.open(ws)
    run_id = log.create_run("pipeline")
    log.add_job(run_id, "training", ["train"], role="training", status="running")
    log.log_metrics(run_id, {"prompts_in_flight": 4, "tokens_so_far": 99, "answers_so_far": 1}, step=0,
                    job="inference")
    app = make_app(ws, inventory=FakeInventory(available=False), live=True, interval_scale=0.2, run_id=run_id,
                   tab="jobs")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        jobs = app.pane("jobs")
        await wait_for(pilot, lambda: "4 prompts in flight · 99 tokens" in screen_text(app), 10, "the progress")
        assert jobs.state.run["status"] == "running"  # this very process is its pid: alive
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        log.update_run(run_id, pid=int(dead.stdout), pid_start_time=1.0)  # a process that is gone
        await wait_for(pilot, lambda: jobs.state.run["status"] == "failed", 10, "the run reaped")
        await wait_for(pilot, lambda: all(r.job["status"] != "running" for r in jobs.rows.values()), 10,
                       "the rows updated")
        # the progress line no longer says "in flight": what the run did, and how it ended
        await wait_for(pilot, lambda: "inference failed: 99 tokens · 1 answers" in screen_text(app), 10,
                       "the progress line of an ended run")
        assert "in flight" not in screen_text(app)


async def test_compare_shows_a_suites_rows_per_domain_and_overall(ws: Path) -> None:
    """A suite's bench: a row per domain and the overall row, whose speed-up is the mean over domains."""
    from adaflash.bench.compare import overall_records

    fill_runlog(ws)
    log = RunLog.open(ws)
    run_id = log.create_run("bench-matrix", name="suite bench", target="smollm2-135m", dataset="suite")
    records = []
    for domain, base, fast in (("math", 600.0, 1200.0), ("code", 500.0, 750.0)):
        for method, tps, tau in (("vanilla", base, 1.0), ("adaflash", fast, 2.0)):
            records.append({"method": method, "target": "smollm2-135m", "dataset": f"suite/{domain}",
                            "domain": domain, "concurrency": 1, "output_throughput": tps, "accept_length": tau,
                            "completed": 4, "num_prompts": 4, "matrix_run": run_id})
    for record in records + overall_records(records, "suite", ["math", "code"]):
        log.add_bench_result(run_id, record)
    log.finish_run(run_id)
    app = make_app(ws, inventory=FakeInventory(available=False), live=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("5")
        await settle(pilot)
        pane = app.pane("compare")
        assert run_id in pane.data.source
        rows = {(r["method"], r["dataset"]): r for r in pane.shown}
        assert set(rows) == {(m, d) for m in ("vanilla", "adaflash") for d in ("suite", "suite/math", "suite/code")}
        assert rows[("adaflash", "suite/math")]["speedup"] == pytest.approx(2.0)
        assert rows[("adaflash", "suite")]["speedup"] == pytest.approx((2.0 + 1.5) / 2)
        assert "suite/code" in screen_text(app)
