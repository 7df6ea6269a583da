"""Reusing finished jobs across runs (jobs.cache): what is reused, what runs again, and resuming after a
failure. Every job appends its name to a ledger outside the cache, so a test sees exactly what ran."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adaflash.runlog import RunLog
from jobs.cache import JobCache, outputs_digest, path_digest
from jobs.plan import prepare
from jobs.recipe import RecipeError, load_recipe
from jobs.runner import Runner

CLI = [sys.executable, "-m", "adaflash.cli.main"]

# make: writes {cache_dir}/made.txt from vars.word; use: reads it and writes {cache_dir}/used.txt;
# measure: no outputs (like a benchmark), so it runs every time; so does `report` after it.
WRITE = "import sys, pathlib; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); " \
        "out = pathlib.Path(sys.argv[3]); out.parent.mkdir(parents=True, exist_ok=True); out.write_text(sys.argv[4])"
COPY = "import sys, pathlib; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); " \
       "pathlib.Path(sys.argv[4]).write_text(pathlib.Path(sys.argv[3]).read_text().upper() + sys.argv[5])"
LEDGER = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"


def graph(tmp_path: Path) -> Path:
    ledger = tmp_path / "ledger"
    path = tmp_path / "graph.toml"
    path.write_text(textwrap.dedent(f"""
        [run]
        name = "graph"
        code = []  # these jobs run no adaflash code (and other people may be editing it meanwhile)
        [vars]
        word = "hello"
        suffix = "!"
        [jobs.make]
        command = ["python", "-c", {json.dumps(WRITE)}, "{ledger}", "make", "{{cache_dir}}/made.txt", "{{vars.word}}"]
        outputs = ["{{cache_dir}}/made.txt"]
        [jobs.use]
        command = ["python", "-c", {json.dumps(COPY)}, "{ledger}", "use", "{{cache_dir}}/made.txt",
                   "{{cache_dir}}/used.txt", "{{vars.suffix}}"]
        outputs = ["{{cache_dir}}/used.txt"]
        after = ["make"]
        [jobs.measure]
        command = ["python", "-c", {json.dumps(LEDGER)}, "{ledger}", "measure"]
        after = ["use"]
        [jobs.report]
        command = ["python", "-c", {json.dumps(LEDGER)}, "{ledger}", "report"]
        outputs = ["{{cache_dir}}/never-written"]
        cache = false
        after = ["measure"]
    """))
    return path


def run_once(recipe: Path, ws: Path, overrides: list[str] = (), **kw) -> tuple[object, dict[str, dict], list[str]]:
    ledger = recipe.parent / "ledger"
    before = ledger.read_text().split() if ledger.exists() else []
    prepared = prepare(recipe, overrides, workspace=ws)
    log = RunLog.open(prepared.workspace)
    result = Runner(prepared, log, tick=0.02, **kw).run()
    ran = ledger.read_text().split()[len(before):] if ledger.exists() else []
    return result, {j["name"]: j for j in log.jobs(prepared.run_id)}, ran


def test_a_second_run_reuses_what_did_not_change_and_measures_again(tmp_path: Path) -> None:
    recipe, ws = graph(tmp_path), tmp_path / "ws"
    result, jobs, ran = run_once(recipe, ws)
    assert result.status == "finished" and ran == ["make", "use", "measure", "report"]
    cache = ws / "cache" / "graph"
    assert (cache / "used.txt").read_text() == "HELLO!"
    assert json.loads((cache / ".jobs" / "make.json").read_text())["run_id"] == result.run_id

    result, jobs, ran = run_once(recipe, ws)
    assert result.status == "finished" and result.exit_code == 0
    assert ran == ["measure", "report"]  # no outputs (or cache = false): always runs
    assert jobs["make"]["status"] == jobs["use"]["status"] == "cached"
    assert "reused the outputs of run" in jobs["use"]["message"] and result.cached == ["make", "use"]
    assert jobs["measure"]["status"] == "finished"


def test_a_copied_workspace_reuses_what_it_holds(tmp_path: Path) -> None:
    """The cache keys and records name workspace paths relative to it: a copy planned to redo every cached
    step ("command, code or inputs changed") because {cache_dir} resolved to another absolute path."""
    import shutil

    recipe, ws = graph(tmp_path), tmp_path / "ws"
    assert run_once(recipe, ws)[2] == ["make", "use", "measure", "report"]
    copy = tmp_path / "copied"
    shutil.copytree(ws, copy)
    shutil.rmtree(ws)
    result, jobs, ran = run_once(recipe, copy)
    assert ran == ["measure", "report"] and result.cached == ["make", "use"]
    record = json.loads((copy / "cache" / "graph" / ".jobs" / "make.json").read_text())
    assert record["outputs"] == ["{workspace}/cache/graph/made.txt"]
    run_dir = RunLog.open(copy).get_run(result.run_id)["run_dir"]
    assert run_dir.startswith(str(copy)) and jobs["measure"]["log_path"].startswith(str(copy))


def test_what_runs_again_follows_the_command_the_upstream_outputs_and_the_outputs_themselves(tmp_path: Path) -> None:
    recipe, ws = graph(tmp_path), tmp_path / "ws"
    cache = ws / "cache" / "graph"
    run_once(recipe, ws)
    # A var only `use` reads: `make` is reused, `use` runs again.
    assert run_once(recipe, ws, ["vars.suffix=?"])[2] == ["use", "measure", "report"]
    assert (cache / "used.txt").read_text() == "HELLO?"
    # A var of `make`: it runs, its output changes, so `use` runs too.
    assert run_once(recipe, ws, ["vars.word=bye", "vars.suffix=?"])[2] == ["make", "use", "measure", "report"]
    assert (cache / "used.txt").read_text() == "BYE?"
    # An output edited by hand is made again.
    (cache / "used.txt").write_text("tampered")
    assert run_once(recipe, ws, ["vars.word=bye", "vars.suffix=?"])[2] == ["use", "measure", "report"]
    # A deleted output is made again; it has the same bytes as before, so `use` is still reused.
    (cache / "made.txt").unlink()
    assert run_once(recipe, ws, ["vars.word=bye", "vars.suffix=?"])[2] == ["make", "measure", "report"]
    # --rerun make: the same.
    assert run_once(recipe, ws, ["vars.word=bye", "vars.suffix=?"], rerun=["make"])[2] == \
        ["make", "measure", "report"]
    # --no-cache: everything runs.
    assert run_once(recipe, ws, ["vars.word=bye", "vars.suffix=?"], use_cache=False)[2] == \
        ["make", "use", "measure", "report"]


def test_a_different_code_version_runs_everything_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, ws = graph(tmp_path), tmp_path / "ws"
    run_once(recipe, ws)
    monkeypatch.setattr(JobCache, "code", property(lambda self: "an edited adaflash"))
    assert run_once(recipe, ws)[2] == ["make", "use", "measure", "report"]
    assert run_once(recipe, ws)[2] == ["measure", "report"]


def test_a_failed_step_stops_the_run_and_a_rerun_resumes_at_it(tmp_path: Path) -> None:
    ws, ledger, marker = tmp_path / "ws", tmp_path / "ledger", tmp_path / "fixed"
    flaky = (f"import os, sys; open({str(ledger)!r}, 'a').write('flaky\\n'); "
             f"print('checking the marker'); os.path.exists({str(marker)!r}) or sys.exit('marker missing'); "
             "open(sys.argv[1], 'w').write('ok')")
    recipe = tmp_path / "flaky.toml"
    recipe.write_text(textwrap.dedent(f"""
        [run]
        name = "flaky"
        code = []
        [jobs.first]
        description = "the step before"
        command = ["python", "-c", {json.dumps(WRITE)}, "{ledger}", "first", "{{cache_dir}}/first.txt", "x"]
        outputs = ["{{cache_dir}}/first.txt"]
        [jobs.flaky]
        description = "fails until the marker exists"
        command = ["python", "-c", {json.dumps(flaky)}, "{{cache_dir}}/flaky.txt"]
        outputs = ["{{cache_dir}}/flaky.txt"]
        after = ["first"]
        [jobs.last]
        command = ["python", "-c", {json.dumps(LEDGER)}, "{ledger}", "last"]
        after = ["flaky"]
        summary = true
    """))
    first = subprocess.run([*CLI, "--workspace", str(ws), "run", str(recipe)], capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 1, first.stderr
    log = RunLog.open(ws)
    run = log.list_runs(kind="recipe")[0]
    log_path = ws / "runs" / run["id"] / "flaky.log"
    out = " ".join(first.stdout.split())  # rich may wrap long lines
    assert f"step 2/3: job flaky failed: exit code 1; log: {log_path}" in out
    assert f"failed step: flaky log: {log_path}" in out
    assert "marker missing" in first.stdout  # the tail of its log
    assert "the 1 step(s) that finished (first) are reused" in out
    assert {j["name"]: j["status"] for j in log.jobs(run["id"])} == {"first": "finished", "flaky": "failed",
                                                                      "last": "stopped"}
    assert ledger.read_text().split() == ["first", "flaky"]

    marker.write_text("")
    second = subprocess.run([*CLI, "--workspace", str(ws), "run", str(recipe)], capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 0, second.stdout + second.stderr
    assert ledger.read_text().split() == ["first", "flaky", "flaky", "last"]  # resumed at the failed step
    run = log.list_runs(kind="recipe")[0]
    assert {j["name"]: j["status"] for j in log.jobs(run["id"])} == {"first": "cached", "flaky": "finished",
                                                                      "last": "finished"}
    out = " ".join(second.stdout.split())
    assert "job first cached: reused the outputs of run" in out
    assert f"run {run['id']} finished: every task finished (1 reused from earlier runs: first)" in out
    assert f"adaflash-tui --workspace {ws} --run {run['id']}" in out
    assert f"run log: {ws / 'runlog.sqlite'}" in out


def test_a_dry_run_says_what_the_cache_would_reuse(tmp_path: Path) -> None:
    recipe, ws = graph(tmp_path), tmp_path / "ws"
    plan = subprocess.run([*CLI, "--workspace", str(ws), "run", str(recipe), "--dry-run"], capture_output=True,
                          text=True, timeout=60)
    assert plan.returncode == 0 and "-> runs (no record with this key)" in plan.stdout
    run_once(recipe, ws)
    plan = subprocess.run([*CLI, "--workspace", str(ws), "run", str(recipe), "--dry-run", "--set", "vars.suffix=?"],
                          capture_output=True, text=True, timeout=60)
    lines = [line for line in plan.stdout.splitlines() if "outputs (cached)" in line]
    assert "-> reused (outputs of run" in lines[0]
    assert "-> runs (command, code or inputs changed, or outputs missing)" in lines[1]
    bad = subprocess.run([*CLI, "--workspace", str(ws), "run", str(recipe), "--rerun", "nope", "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--rerun: no job nope in recipe graph" in bad.stderr


def test_outputs_are_only_removed_inside_the_workspace_or_cache(tmp_path: Path) -> None:
    outside = tmp_path / "mine.txt"
    outside.write_text("keep me")
    inside = tmp_path / "ws" / "cache" / "outside" / "old.txt"
    inside.parent.mkdir(parents=True)
    inside.write_text("stale")
    recipe = tmp_path / "outside.toml"
    recipe.write_text(textwrap.dedent(f"""
        [run]
        name = "outside"
        [jobs.touch]
        command = ["python", "-c", "print('ran')"]
        outputs = ["{outside}", "{{workspace}}", "{{workspace}}/runs", "{{cache_dir}}", "{inside}"]
    """))
    result, jobs, _ = run_once(recipe, tmp_path / "ws", use_cache=False)
    assert result.status == "finished" and outside.read_text() == "keep me"
    assert (tmp_path / "ws" / "runlog.sqlite").exists() and (tmp_path / "ws" / "runs").is_dir()
    assert not inside.exists()  # a stale output inside the cache folder is cleared before the job runs


def test_recipe_checks_for_cached_jobs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(textwrap.dedent("""
        [run]
        name = "bad"
        [jobs.svc]
        command = ["python", "-m", "http.server"]
        kind = "service"
        outputs = ["x"]
        [jobs.per_run]
        command = ["python", "-c", "pass", "{run_dir}/out"]
        outputs = ["{cache_dir}/out"]
        [jobs.fine]
        command = ["python", "-c", "pass", "{run_dir}/out"]
        outputs = ["{cache_dir}/out"]
        cache = false
        progress = { total = "many", metric = 3 }
    """))
    with pytest.raises(RecipeError) as err:
        load_recipe(bad)
    text = str(err.value)
    assert f"{bad}:7: jobs.svc.outputs: only a task" in text
    assert f"{bad}:10: jobs.per_run.outputs: a job with outputs is reused across runs" in text
    assert "jobs.fine.outputs" not in text
    assert f"{bad}:15: jobs.fine.progress.total: expected a positive number" in text
    assert f"{bad}:15: jobs.fine.progress.metric: expected a metric name" in text


def test_digests_see_content_names_and_missing_paths(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a").write_text("1")
    first = path_digest(folder)
    (folder / "sub" / "a").write_text("2")
    assert path_digest(folder) != first
    (folder / "sub" / "a").write_text("1")
    assert path_digest(folder) == first
    (folder / "sub" / "a").rename(folder / "sub" / "b")
    assert path_digest(folder) != first
    assert path_digest(tmp_path / "missing") is None
    assert outputs_digest([str(folder), str(tmp_path / "missing")]) is None


def test_the_code_version_follows_the_source_of_the_packages_named(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs import cache

    package = tmp_path / "toy_pkg_for_cache"
    package.mkdir()
    (package / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cache, "_code_cache", {})
    first = cache.code_version("toy_pkg_for_cache")
    (package / "__init__.py").write_text("X = 2\n")
    monkeypatch.setattr(cache, "_code_cache", {})
    assert cache.code_version("toy_pkg_for_cache") != first
    assert JobCache(tmp_path, packages=[]).code == ""
    assert load_recipe(graph(tmp_path)).code == [] and load_recipe("smollm2-cpu").code == ["adaflash"]
