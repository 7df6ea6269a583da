"""SVG snapshots of every adaflash-tui screen at 80×24 (the smallest it is laid out for) and 160×50, over the
fixture run log.

Deterministic by construction: fixed ids, timestamps and pids in the run log, a fake GPU
inventory, no polling timers, UTC, a fixed workspace path and interpreter path (both appear in
the Launch plan and the Jobs log title), and a fixed run id for plans.
Update the baselines with `pytest -n 0 tests/test_tui_snapshots.py --snapshot-update` (in one process).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import Input

from tests.test_tui_fixtures import FIXED_RUN_ID, RECIPE_RUN, FakeInventory, fill_runlog, settle
from tui.app import AdaflashApp

SIZES = {"80x24": (80, 24), "160x50": (160, 50)}
WORKSPACE = Path("/tmp/adaflash-tui-snapshots/ws")
pytestmark = pytest.mark.xdist_group("tui-snapshots")  # one fixed workspace: one xdist worker at a time


@pytest.fixture()
def snap_app(monkeypatch):
    """An app over the fixture run log, following the fixture's recipe run."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    monkeypatch.setenv("ADAFLASH_LEASES", str(WORKSPACE.parent / "leases.json"))
    shutil.rmtree(WORKSPACE.parent, ignore_errors=True)
    fill_runlog(WORKSPACE)

    def make(tab: str, gpus: int = 2, run_id: str | None = RECIPE_RUN) -> AdaflashApp:
        app = AdaflashApp(WORKSPACE, inventory=FakeInventory(gpus, available=gpus > 0), live=False, run_id=run_id,
                          run_ids=lambda: FIXED_RUN_ID, tab=tab)
        app.animation_level = "none"
        return app

    yield make
    monkeypatch.undo()  # TZ back first, then let the C library re-read it
    time.tzset()


def show(then=None):
    async def run_before(pilot) -> None:
        await settle(pilot)
        if then is not None:
            await then(pilot)
            await settle(pilot)

    return run_before


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_gpus(snap_compare, snap_app, size) -> None:
    assert snap_compare(snap_app("gpus"), terminal_size=SIZES[size], run_before=show())


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_launch_pipeline(snap_compare, snap_app, size) -> None:
    async def fill_form(pilot) -> None:
        await pilot.click("#mode-pipeline")
        await settle(pilot)
        (WORKSPACE / "drafters" / "dflash").mkdir(parents=True)
        (WORKSPACE / "data").mkdir()
        (WORKSPACE / "data" / "gsm8k_train.jsonl").write_text('{"prompt": "hi"}\n')
        pilot.app.query_one("#draft", Input).value = str(WORKSPACE / "drafters" / "dflash")
        pilot.app.query_one("#dataset", Input).value = "gsm8k"
        pilot.app.query_one("#max-samples", Input).value = "32"
        await settle(pilot)
        pilot.app.pane("launch").focus_primary()

    assert snap_compare(snap_app("launch"), terminal_size=SIZES[size], run_before=show(fill_form))


def test_snapshot_launch_blocked_with_an_offer(snap_compare, snap_app) -> None:
    """A dataset not prepared: the launch is refused, and the form offers to prepare it."""
    async def fill_form(pilot) -> None:
        await pilot.click("#mode-bench")
        await settle(pilot)
        pilot.app.query_one("#dataset", Input).value = "gsm8k"
        await settle(pilot)
        pilot.app.query_one("#dataset", Input).focus()

    assert snap_compare(snap_app("launch"), terminal_size=SIZES["80x24"], run_before=show(fill_form))


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_jobs(snap_compare, snap_app, size) -> None:
    assert snap_compare(snap_app("jobs"), terminal_size=SIZES[size], run_before=show())


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_monitor(snap_compare, snap_app, size) -> None:
    assert snap_compare(snap_app("monitor"), terminal_size=SIZES[size], run_before=show())


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_compare(snap_compare, snap_app, size) -> None:
    assert snap_compare(snap_app("compare"), terminal_size=SIZES[size], run_before=show())


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_history(snap_compare, snap_app, size) -> None:
    assert snap_compare(snap_app("history"), terminal_size=SIZES[size], run_before=show())


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_procs(snap_compare, snap_app, size) -> None:
    """The fixture's jobs ended long ago: every live figure reads N/A (the layout, not the numbers)."""
    assert snap_compare(snap_app("procs"), terminal_size=SIZES[size], run_before=show())


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_query(snap_compare, snap_app, size) -> None:
    async def run_a_view(pilot) -> None:
        pane = pilot.app.pane("query")
        box = pilot.app.query_one("#query-sources")
        box.highlighted = [s.name for s in pane.sources].index("tau_per_version")
        await pilot.press("enter")
        await settle(pilot)

    assert snap_compare(snap_app("query"), terminal_size=SIZES[size], run_before=show(run_a_view))


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_jobs_log_searched_and_wrapped(snap_compare, snap_app, size) -> None:
    async def search(pilot) -> None:
        log = WORKSPACE / "runs" / RECIPE_RUN / "bench.log"
        log.write_text("".join(f"[bench] step {i}: ok\n" for i in range(30)) + "[bench] " + "long line " * 30 + "\n")
        table = pilot.app.query_one("#jobs-table")
        table.focus()
        table.move_cursor(row=2)
        await settle(pilot)
        await pilot.press("w", "slash", *"step 1", "enter", "n")

    assert snap_compare(snap_app("jobs"), terminal_size=SIZES[size], run_before=show(search))
