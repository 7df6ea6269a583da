"""A launch that would fail is refused, and the form offers what fixes it: a tester launched a pipeline
on `gsm8k` before preparing it; the form said `! dataset gsm8k: …` yet `ready to launch`, the job exited 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.launch_plan import LaunchChoice, build, prepare_recipe
from jobs.recipe import parse_recipe
from tests.test_tui_fixtures import FakeInventory, screen_text, wait_for
from tests.test_tui_flows import SIZE, fill_launch_form, make_app, stop_leftovers


@pytest.fixture()
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace of its own; GPU leases of the fake GPUs in a private file, never the user's."""
    monkeypatch.setenv("ADAFLASH_LEASES", str(tmp_path / "leases.json"))
    path = tmp_path / "ws"
    path.mkdir()
    monkeypatch.setenv("ADAFLASH_WORKSPACE", str(path))
    return path


def test_what_is_missing_now_is_an_error_of_a_launch_and_a_warning_of_the_recipe(tmp_path: Path) -> None:
    choice = LaunchChoice(mode="bench", dataset="gsm8k,humaneval,mine.jsonl", roles=(("server", None),))
    built = build(choice, tmp_path / "recipes", workspace=tmp_path)
    assert [e.split(":")[0] for e in built.errors] == ["dataset gsm8k", "dataset humaneval", "dataset 'mine.jsonl'"]
    assert built.warnings == [] and built.prepare == ["gsm8k", "humaneval"]
    (tmp_path / "data").mkdir()
    for name in ("gsm8k", "humaneval"):
        (tmp_path / "data" / f"{name}_test.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "mine.jsonl").write_text('{"prompt": "hi"}\n')
    choice = LaunchChoice(mode="bench", dataset=f"gsm8k,humaneval,{tmp_path / 'mine.jsonl'}",
                          bench_methods=("dflash",), roles=(("server", None),))
    built = build(choice, tmp_path / "recipes", workspace=tmp_path)
    assert built.errors == [] and built.prepare == []
    assert built.warnings == ["no Vanilla in the matrix: speed-ups need a Vanilla row of the same run"]  # informs only
    recipe = parse_recipe(prepare_recipe(["gsm8k", "mt-bench"]), "tui-data-prepare.toml")
    assert {name: job.command for name, job in recipe.jobs.items()} == {
        "prepare_gsm8k": ["adaflash", "data", "prepare", "gsm8k"],
        "prepare_mt_bench": ["adaflash", "data", "prepare", "mt-bench"]}
    assert all(job.gpus is None for job in recipe.jobs.values())


async def test_an_unprepared_dataset_blocks_the_launch_and_the_form_prepares_it(ws: Path) -> None:
    app = make_app(ws, inventory=FakeInventory(2), live=False)
    try:
        async with app.run_test(size=SIZE) as pilot:
            launch = await fill_launch_form(pilot, "#mode-pipeline", {"#dataset": "gsm8k", "#max-samples": "4"})
            assert [e for e in launch.errors if e.startswith("dataset gsm8k: not prepared")], launch.errors
            text = screen_text(app)
            assert "ready to launch" not in text and "cannot launch" in text and "✗ dataset gsm8k" in text
            assert app.query_one("#launch-button").disabled
            await pilot.press("ctrl+l")  # refused
            await pilot.pause()
            assert app.launched == []
            assert launch.built.prepare == ["gsm8k"] and "Prepare gsm8k" in screen_text(app)
            await pilot.press("ctrl+o")  # runs `adaflash data prepare gsm8k` as a job, the form follows it
            await wait_for(pilot, lambda: launch.preparing, 30, "the prepare run")
            run_id = next(iter(launch.preparing))
            assert run_id in app.launched and app.active_tab == "launch"
            await wait_for(pilot, lambda: not launch.preparing, 90, "the prepare run's end")
            assert launch.prepare_state[run_id][0] == "finished"
            assert (ws / "data" / "gsm8k_train.jsonl").is_file()
            await wait_for(pilot, lambda: launch.errors == [] and "ready to launch" in screen_text(app), 10,
                           "the form checked again")
            assert app.query_one("#prepare-offer").has_class("hidden")
    finally:
        stop_leftovers(ws)
