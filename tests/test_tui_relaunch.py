"""History's rerun (r) and load (l) for every kind of run the Launch form can start: the record of a
pipeline, a server or a benchmark fills the form; a recipe run is launched again after a confirmation."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Checkbox, Input, Select, SelectionList

from adaflash.runlog import RunLog
from jobs.launch_plan import LaunchChoice
from jobs.rerun import NotRelaunchable, relaunch_built, relaunch_of
from tests.test_tui_fixtures import (
    GENERATE_RUN,
    PIPELINE_RUN,
    FakeInventory,
    fill_runlog,
    settle,
    wait_for,
)
from tests.test_tui_flows import SIZE, make_app
from tui.modals import ConfirmScreen

PIPELINE_CONFIG = {"preset": "osd", "swap_dir": "/x/swap", "infer_gpus": "0", "train_gpus": "0",
                   "max_samples": 40, "max_minutes": 5, "engine_config": {"max_batch": 6}}


def test_a_pipeline_record_becomes_the_form_and_its_recipe(tmp_path: Path) -> None:
    run = {"id": "r1", "kind": "pipeline", "method": "osd", "target": "smollm2-135m", "draft": "/d/init",
           "dataset": "gsm8k", "config": PIPELINE_CONFIG}
    relaunch = relaunch_of(run)
    assert relaunch.mode == "pipeline" and relaunch.roles == {"inference": (0,), "training": (0,)}
    choice = relaunch.choice(LaunchChoice())
    assert (choice.preset, choice.target, choice.dataset, choice.max_samples, choice.batch_size, choice.max_minutes) \
        == ("osd", "smollm2-135m", "gsm8k", "40", "6", "5")
    assert choice.share  # both roles on GPU 0, as the run had them
    built = relaunch_built(relaunch, tmp_path / "recipes", tmp_path, [0], "rerun-x")
    assert built.recipe_path and built.recipe_path.endswith("tui-pipeline-rerun-x.toml")
    assert "--preset" in (built.recipe_text or "") and "osd" in (built.recipe_text or "")


def test_server_and_matrix_records_and_what_cannot_be_rerun() -> None:
    server = relaunch_of({"id": "s", "kind": "serve", "method": "dflash", "target": "t", "draft": "/d",
                          "config": {"port": 31000, "adapt": True}})
    assert (server.mode, server.fields["method"], server.fields["port"], server.fields["adapt"]) == \
        ("server", "dflash", "31000", True)
    matrix = relaunch_of({"id": "m", "kind": "bench-matrix", "target": "t", "dataset": "gsm8k",
                          "config": {"methods": ["vanilla", "adaflash"], "datasets": ["gsm8k", "humaneval"],
                                     "concurrency": [1, 4], "num_prompts": 8, "drafts": {"adaflash": "/a"},
                                     "gpus": "1"}})
    assert matrix.mode == "bench" and matrix.fields["bench_methods"] == ("vanilla", "adaflash")
    assert (matrix.fields["dataset"], matrix.fields["concurrency"], matrix.fields["draft"]) == \
        ("gsm8k,humaneval", "1,4", "adaflash=/a")
    assert matrix.roles == {"server": (1,)}
    recipe = relaunch_of({"id": "r", "kind": "recipe", "config": {"path": __file__, "overrides": ["vars.n=2"]}})
    assert recipe.overrides == ("vars.n=2",) and recipe.choice().sets == "vars.n=2"
    built = relaunch_built(recipe, Path("/unused"), Path("/unused"), [], "x")
    assert (built.recipe_path, built.overrides) == (__file__, ["vars.n=2"])
    with pytest.raises(NotRelaunchable, match="generate run"):
        relaunch_of({"id": "g", "kind": "generate", "config": {}})
    with pytest.raises(NotRelaunchable, match="gone"):
        relaunch_of({"id": "x", "kind": "recipe", "config": {"path": "/nowhere/r.toml"}})


async def test_load_fills_the_launch_form_from_a_pipeline_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ADAFLASH_LEASES", str(tmp_path / "leases.json"))
    ws = tmp_path / "ws"
    log = fill_runlog(ws)
    log.update_run(PIPELINE_RUN, config=PIPELINE_CONFIG)
    app = make_app(ws, inventory=FakeInventory(2), live=False, tab="history")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        history = app.pane("history")
        table = app.query_one("#runs-table")
        table.focus()
        table.move_cursor(row=[r["id"] for r in history.shown].index(PIPELINE_RUN))
        await pilot.press("l")
        await wait_for(pilot, lambda: app.active_tab == "launch", 10, "the Launch tab")
        await settle(pilot)
        launch = app.pane("launch")
        assert launch.mode == "pipeline" and app.query_one("#mode-pipeline").value
        assert app.query_one("#preset-osd").value
        assert app.query_one("#dataset", Input).value == "gsm8k"
        assert app.query_one("#max-samples", Input).value == "40"
        assert app.query_one("#batch-size", Input).value == "6"
        assert launch.method_roles["inference"] == (0,) and launch.method_roles["training"] == (0,)
        assert launch.share


async def test_load_fills_a_server_and_refuses_what_it_cannot(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ADAFLASH_LEASES", str(tmp_path / "leases.json"))
    ws = tmp_path / "ws"
    log = fill_runlog(ws)
    server = log.create_run("serve", method="dflash", target="smollm2-135m", draft="",
                            config={"port": 31234, "adapt": False}, status="stopped")
    matrix = log.create_run("bench-matrix", target="smollm2-135m", dataset="gsm8k", status="finished",
                            config={"methods": ["vanilla", "dflash"], "datasets": ["gsm8k"], "concurrency": [2],
                                    "num_prompts": 4})
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, tab="history")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        history = app.pane("history")
        table = app.query_one("#runs-table")
        for run_id in (server, matrix, GENERATE_RUN):
            app.show_tab("history")
            await settle(pilot)
            table.focus()
            table.move_cursor(row=[r["id"] for r in history.shown].index(run_id))
            await pilot.press("l")
            await settle(pilot)
            if run_id == server:
                assert app.active_tab == "launch" and app.pane("launch").mode == "server"
                assert app.query_one("#port", Input).value == "31234"
                assert app.query_one("#server-method", Select).value == "dflash"
                assert not app.query_one("#adapt", Checkbox).value
            elif run_id == matrix:
                assert app.pane("launch").mode == "bench"
                assert list(app.query_one("#bench-methods", SelectionList).selected) == ["vanilla", "dflash"]
                assert app.query_one("#concurrency", Input).value == "2"
            else:
                assert app.active_tab == "history"
                assert any("generate run" in n.message for n in app._notifications)


async def test_rerun_launches_a_recipe_run_again_after_a_confirmation(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ADAFLASH_LEASES", str(tmp_path / "leases.json"))
    ws = tmp_path / "ws"
    log = fill_runlog(ws)
    recipe = ws / "recipes" / "again.toml"
    recipe.parent.mkdir()
    recipe.write_text('[run]\nname = "again"\n\n[vars]\nword = "one"\n\n'
                      '[jobs.hello]\ncommand = ["python", "-c", "print(\'{vars.word}\')"]\n')
    old = log.create_run("recipe", name="again", config={"path": str(recipe), "jobs": {}, "overrides": ["vars.word=two"]},
                         status="finished")
    app = make_app(ws, inventory=FakeInventory(available=False), live=False, tab="history")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        history = app.pane("history")
        table = app.query_one("#runs-table")
        table.focus()
        table.move_cursor(row=[r["id"] for r in history.shown].index(old))
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
        await pilot.press("n")  # cancelled: nothing starts
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 10, "the dialog closed")
        assert app.launched == []
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: bool(app.launched), 30, "the new run")
        new = app.launched[0]
        assert new != old and app.current_run_id == new and app.active_tab == "jobs"
        await wait_for(pilot, lambda: RunLog.open(ws).get_run(new)["status"] == "finished", 60, "the rerun to end")
        again = RunLog.open(ws)
        assert again.get_run(new)["name"] == "again"
        assert again.jobs(new)[0]["command"][-1] == "print('two')"  # the run's overrides, again
