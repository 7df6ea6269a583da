"""The TUI's pure parts: planning through the backend (checked by `jobs` itself), the Monitor's
incremental model, the Compare filter/sort, the log tail reader, and the action registry."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jobs.launch_plan import LaunchChoice, method_recipe
from jobs.recipe import RecipeError, parse_recipe
from tui.actions import BY_ID, REGISTRY, SCOPES, bindings_for, help_rows
from tui.backend import Backend, rows_csv
from tui.monitor_model import HISTORY, MonitorModel, fmt, spark
from tui.panes.compare import matches, sort_key


def server_recipe(roles: dict) -> str:
    text, _, _ = method_recipe(LaunchChoice(mode="server", method="vanilla", roles=tuple(sorted(roles.items()))))
    return text


def test_backend_plan_reports_problems_inline_never_raises(tmp_path: Path) -> None:
    backend = Backend(tmp_path, run_ids=lambda: "RUN-1")
    text = server_recipe({"server": (5,)})
    plan = backend.plan(tmp_path / "r.toml", [], None, recipe_text=text)
    assert plan.errors == [] and plan.run_id == "RUN-1" and "RUN-1" in plan.plan_text
    from jobs.gpus import HostInfo, Snapshot

    no_gpu = Snapshot(False, "no driver", [], HostInfo(None, None, None, None, None))
    plan = backend.plan(tmp_path / "r.toml", [], no_gpu, recipe_text=text)
    assert any("GPU 5 does not exist" in e for e in plan.errors)
    broken = backend.plan(tmp_path / "r.toml", ["gpus.server=[]"], None)
    assert broken.plan_text is None and any("has no GPU" in e for e in broken.errors)
    with pytest.raises(RecipeError):
        parse_recipe("[run]\n", "x.toml")  # (what `plan` turns into messages)


def rows(run_id: str, start: int, items: list[tuple[str, float, int]], job: str = "inference") -> list[dict]:
    return [{"id": start + i, "run_id": run_id, "job": job, "step": step, "name": name, "value": value,
             "time": 100.0 + start + i} for i, (name, value, step) in enumerate(items)]


def test_monitor_model_folds_only_new_rows_and_groups_tau_by_version() -> None:
    model = MonitorModel("R")
    batch = rows("R", 1, [("tau", 2.0, 0), ("tokens_per_s", 10, 0), ("drafter_version", 0, 0),
                          ("tau", 3.0, 1), ("drafter_version", 1, 1), ("tokens_per_s", 20, 1)])
    assert model.ingest("R", {"R": ""}, {"R": batch}) == 6
    assert model.cursors == {"R": 6} and model.rows_seen == 6
    assert model.ingest("R", {"R": ""}, {"R": batch}) == 0  # a late duplicate changes nothing
    generation = model.generation
    assert model.ingest("OTHER", {}, {"OTHER": batch}) == 0 and model.generation == generation
    versions = model.version_table()
    assert [(v.version, v.tau, v.tokens_per_s) for v in versions] == [(0, 2.0, 10.0), (1, 3.0, 20.0)]
    tau = model.series[("", "tau")]
    assert (tau.count, tau.last, tau.low, tau.high, tau.mean) == (2, 3.0, 2.0, 3.0, 2.5)
    label, xs, ys = model.chart(["tau"])[0]
    assert label == "tau" and xs == [0.0, 3.0] and ys == [2.0, 3.0]
    # a child run's rows are labelled with the job that created it
    model.ingest("R", {"C": "pipeline"}, {"C": rows("C", 7, [("loss", 1.5, 0)], job="training")})
    assert model.series[("pipeline", "loss")].label == "pipeline:loss"


def test_monitor_model_memory_is_bounded() -> None:
    model = MonitorModel("R")
    model.ingest("R", {"R": ""}, {"R": rows("R", 1, [("tau", float(i), i) for i in range(HISTORY * 3)])})
    tau = model.series[("", "tau")]
    assert tau.count == HISTORY * 3 and len(tau.points) == HISTORY


def test_formatting_never_raises() -> None:
    assert fmt(None) == "N/A" and fmt(float("nan")) == "N/A" and fmt(3.0) == "3" and fmt(2.345) == "2.35"
    assert fmt(0.01234) == "0.0123" and fmt(123.45) == "123.5" and fmt(2.5e7) == "2.5e+07"
    assert spark([]) == "" and spark([1, 1, 1]) == "▄▄▄" and spark([0, 1]) == "▁█"


def test_monitor_progress_line_from_the_workers_progress_records() -> None:
    model = MonitorModel("r")
    assert model.progress() == ""
    rows = [{"id": 1, "run_id": "c", "job": "inference", "step": 0, "name": "prompts_in_flight", "value": 16.0,
             "time": 1.0},
            {"id": 2, "run_id": "c", "job": "inference", "step": 0, "name": "tokens_so_far", "value": 1234.0,
             "time": 1.0},
            {"id": 3, "run_id": "c", "job": "inference", "step": 0, "name": "answers_so_far", "value": 0.0, "time": 1.0},
            {"id": 4, "run_id": "c", "job": "training", "step": 1, "name": "training_step", "value": 1.0, "time": 2.0}]
    model.ingest("r", {"c": "pipeline"}, {"c": rows})
    assert model.progress() == ("inference: 16 prompts in flight · 1,234 tokens · 0 answers │ "
                                "training: step 1")


def test_compare_filter_and_sort_keys() -> None:
    row = {"method": "adaflash", "dataset": "gsm8k", "target": "Qwen/Qwen3-8B", "concurrency": 4}
    assert matches(row, "ada gsm") and matches(row, "dataset=GSM concurrency=4")
    assert not matches(row, "method=dflash") and not matches(row, "humaneval")
    data = [{"x": 2.0}, {"x": None}, {"x": 1.0}]
    assert [r["x"] for r in sorted(data, key=sort_key("x"))] == [1.0, 2.0, None]


def test_rows_csv_keeps_raw_numbers() -> None:
    text = rows_csv([{"group": "g", "run_id": "r", "method": "vanilla", "speedup": 1.0, "fair": True}])
    assert text.splitlines()[0].startswith("group,run_id,method") and ",1.0," in text.splitlines()[1]


def test_read_log_tails_then_follows(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("".join(f"line {i}\n" for i in range(10000)))
    first = Backend.read_log(str(log), 0)
    assert first.reset and first.text.startswith("line ") and first.text.endswith("line 9999\n")
    assert len(first.text) <= 32 * 1024 and first.offset == log.stat().st_size
    with log.open("a") as handle:
        handle.write("new\n")
    nxt = Backend.read_log(str(log), first.offset)
    assert not nxt.reset and nxt.text == "new\n"
    log.write_text("rotated\n")  # truncated: start again
    again = Backend.read_log(str(log), nxt.offset)
    assert again.reset and again.text == "rotated\n"
    assert Backend.read_log(str(tmp_path / "missing.log"), 0).text == ""


def test_registry_feeds_bindings_and_help() -> None:
    assert len({c.id for c in REGISTRY}) == len(REGISTRY)
    assert {c.scope for c in REGISTRY} <= set(SCOPES)
    for scope in SCOPES:
        ids = [b.id for b in bindings_for(scope)]
        assert ids == [c.id for c in REGISTRY if c.scope == scope]
    assert len(help_rows()) == len(REGISTRY)
    assert BY_ID["compare.markdown"].key_display == "e" and BY_ID["launch.go"].key_display == "^l"
    keys_per_scope: dict[str, set[str]] = {}
    for command in REGISTRY:  # no key bound twice within one scope, nor shadowing an app key
        for key in command.key.split(","):
            seen = keys_per_scope.setdefault(command.scope, set())
            assert key not in seen, (command.scope, key)
            seen.add(key)
    from textual.widgets import Input

    typing_keys = {k for b in Input.BINDINGS for k in b.key.split(",")}  # type: ignore[union-attr]
    for scope in ("launch", "compare", "history"):  # panes with text inputs: those keys must reach the pane
        assert not keys_per_scope[scope] & typing_keys, scope
    app_keys = keys_per_scope["app"]
    for scope, keys in keys_per_scope.items():
        if scope != "app":
            assert not keys & app_keys, scope


def test_training_and_generation_speeds_never_share_an_axis() -> None:
    """Training tok/s (thousands) and generation tok/s (tens) were drawn on one axis."""
    from tui.monitor_model import CHARTS

    model = MonitorModel("r")
    rows = [{"id": 1, "run_id": "a", "job": "inference", "step": 1, "name": "tokens_per_s", "value": 40.0, "time": 1.0},
            {"id": 2, "run_id": "b", "job": "train", "step": 1, "name": "tokens_per_s", "value": 5000.0, "time": 1.0},
            {"id": 3, "run_id": "a", "job": "training", "step": 1, "name": "train_tokens_per_s", "value": 3000.0,
             "time": 2.0}]
    model.ingest("r", {"a": "pipeline", "b": "train"}, {"a": [rows[0], rows[2]], "b": [rows[1]]})
    (_, left, right), = [c for c in CHARTS if "tokens_per_s" in c[1]]
    assert [(label, ys) for label, _, ys in model.chart(left)] == [("pipeline:tokens_per_s", [40.0])]
    assert sorted((label, ys) for label, _, ys in model.chart(right)) == [
        ("pipeline:train_tokens_per_s", [3000.0]), ("train:train_tokens_per_s", [5000.0])]
    assert not set(left) & set(right)


def test_backend_status_names_match_the_run_log_and_the_supervisor() -> None:
    """tui.backend keeps its own copies so the first paint needs neither module."""
    from adaflash.runlog import LIVE_RUN_STATUSES
    from jobs.supervisor import ACTIVE
    from tui import backend

    assert backend.LIVE_RUN_STATUSES == LIVE_RUN_STATUSES
    assert (*ACTIVE, "restarting") == backend.ACTIVE_JOB_STATUSES


def test_the_first_screen_imports_neither_the_run_log_nor_the_other_panes() -> None:
    """Startup to first paint took 2-3 s, most of it importing what only later reads need."""
    import os
    import subprocess

    code = ("import sys, tui.app, tui.panes.gpus; "
            "print(sorted(m for m in ('adaflash.runlog', 'sqlite_utils', 'jobs.plan', 'tui.panes.monitor', "
            "'tui.panes.launch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.strip() == "[]"


def test_the_progress_line_says_what_was_done_once_the_run_ended() -> None:
    """After the run ended it still read "1 prompts in flight … training: step 1"."""
    model = MonitorModel("r")
    progress = [{"id": 1, "run_id": "c", "job": "inference", "step": 0, "name": "prompts_in_flight", "value": 1.0,
                 "time": 1.0},
                {"id": 2, "run_id": "c", "job": "inference", "step": 0, "name": "tokens_so_far", "value": 900.0,
                 "time": 1.0},
                {"id": 3, "run_id": "c", "job": "inference", "step": 0, "name": "answers_so_far", "value": 8.0,
                 "time": 1.0},
                {"id": 4, "run_id": "c", "job": "training", "step": 1, "name": "training_step", "value": 1.0,
                 "time": 2.0}]
    model.ingest("r", {"r": "", "c": "pipeline"}, {"c": progress}, {"r": "running", "c": "running"})
    assert model.progress().startswith("inference: 1 prompts in flight")
    generation = model.generation
    model.ingest("r", {"r": "", "c": "pipeline"}, {"c": []}, {"r": "stopped", "c": "stopped"})
    assert model.generation > generation  # no new row, yet the view changes
    assert model.progress() == "inference stopped: 900 tokens · 8 answers │ training stopped at step 1"
    assert "in flight" not in model.progress()
