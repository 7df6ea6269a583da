"""Comparison tables over a fixture run log, export, and the import of SGLang bench_serving lines."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from adaflash.bench.compare import FAIRNESS_RULES, comparison_rows, from_sglang, select_records

SGLANG_LINE = {
    "tag": None, "backend": "sglang", "dataset_name": "sharegpt", "request_rate": "inf", "max_concurrency": 32,
    "server_info": {"model_path": "Qwen/Qwen3-8B", "speculative_algorithm": "DFLASH",
                    "speculative_draft_model_path": "z-lab/Qwen3-8B-DFlash-b16", "tp_size": 1,
                    "internal_states": [{"avg_spec_accept_length": 4.2, "last_gen_throughput": 900.0}]},
    "duration": 50.0, "completed": 1000, "total_input_tokens": 200000, "total_output_tokens": 150000,
    "request_throughput": 20.0, "input_throughput": 4000.0, "output_throughput": 3000.0, "total_throughput": 7000.0,
    "mean_e2e_latency_ms": 1500.0, "median_e2e_latency_ms": 1400.0, "std_e2e_latency_ms": 300.0,
    "p99_e2e_latency_ms": 2500.0, "mean_ttft_ms": 80.0, "median_ttft_ms": 70.0, "std_ttft_ms": 10.0, "p99_ttft_ms": 150.0,
    "mean_tpot_ms": 9.0, "median_tpot_ms": 8.5, "std_tpot_ms": 1.0, "p99_tpot_ms": 15.0, "mean_itl_ms": 30.0,
    "median_itl_ms": 28.0, "std_itl_ms": 5.0, "p95_itl_ms": 40.0, "p99_itl_ms": 50.0, "concurrency": 29.7,
    "accept_length": None,
}


def _record(method: str, throughput: float, *, dataset: str = "gsm8k", concurrency: int = 1, **extra) -> dict:
    return {"method": method, "target": "smollm2-135m", "draft": None if method == "vanilla" else f"/d/{method}",
            "dataset": dataset, "concurrency": concurrency, "max_concurrency": concurrency, "num_prompts": 8,
            "completed": 8, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64, "hardware": "cpu-x",
            "output_throughput": throughput, "accept_length": 1.0 if method == "vanilla" else 3.0,
            "accept_rate": None if method == "vanilla" else 0.4, "median_ttft_ms": 10.0, "p99_ttft_ms": 20.0,
            "median_tpot_ms": 5.0, "p99_tpot_ms": 9.0, "median_itl_ms": 5.0, "p99_itl_ms": 9.0, "accuracy": 0.5, **extra}


@pytest.fixture()
def matrix_log(workspace):
    """A matrix of vanilla/dflash/adaflash × c=1,4 on gsm8k, recorded the way `bench matrix` records it."""
    from adaflash.runlog import RunLog

    log = RunLog.open(workspace)
    old = log.create_run("bench-matrix")
    log.add_bench_result(log.create_run("bench"), _record("vanilla", 999.0, matrix_run=old))
    log.finish_run(old)
    matrix = log.create_run("bench-matrix", target="smollm2-135m")
    speeds = {("vanilla", 1): 100.0, ("dflash", 1): 180.0, ("adaflash", 1): 220.0,
              ("vanilla", 4): 300.0, ("dflash", 4): 390.0, ("adaflash", 4): 450.0}
    for (method, conc), speed in speeds.items():
        child = log.create_run("bench", method=method, config={"matrix_run": matrix})
        log.add_bench_result(child, _record(method, speed, concurrency=conc, matrix_run=matrix))
        log.finish_run(child)
    log.finish_run(matrix)
    return log, matrix


def test_speedup_is_against_vanilla_of_the_same_matrix_dataset_and_concurrency(matrix_log):
    log, matrix = matrix_log
    records, where = select_records(log, [matrix])
    assert where == matrix and len(records) == 6
    rows, warnings = comparison_rows(records)
    by = {(r["method"], r["concurrency"]): r for r in rows}
    assert by[("vanilla", 1)]["speedup"] == pytest.approx(1.0)
    assert by[("dflash", 1)]["speedup"] == pytest.approx(1.8)
    assert by[("adaflash", 1)]["speedup"] == pytest.approx(2.2)
    assert by[("adaflash", 4)]["speedup"] == pytest.approx(1.5)
    assert [r["method"] for r in rows[:3]] == ["vanilla", "dflash", "adaflash"]
    assert warnings == [] and all(r["fair"] for r in rows)
    latest, _ = select_records(log, None)
    assert {r["result_id"] for r in latest} == {r["result_id"] for r in records}


def test_a_recipe_run_compares_what_the_runs_its_jobs_created_benchmarked(workspace):
    """A bench matrix launched by a recipe (the dashboard's Launch) records its results under the run its
    job created: comparing the recipe's run showed an empty table."""
    from adaflash.runlog import RunLog

    log = RunLog.open(workspace)
    recipe = log.create_run("recipe")
    job = log.add_job(recipe, "matrix", ["adaflash", "bench", "matrix"], role=None, gpus="", log_path="x.log")
    log.update_job(job, pid=4242)
    matrix = log.create_run("bench-matrix")
    log.update_run(matrix, pid=4242)
    for method, speed in (("vanilla", 100.0), ("dflash", 170.0)):
        child = log.create_run("bench", method=method, config={"matrix_run": matrix})
        log.add_bench_result(child, _record(method, speed, matrix_run=matrix))
    records, where = select_records(log, [recipe])
    assert sorted(r["method"] for r in records) == ["dflash", "vanilla"] and where == recipe
    rows, _ = comparison_rows(records)
    assert {r["method"]: r["speedup"] for r in rows}["dflash"] == pytest.approx(1.7)
    other = log.create_run("recipe")  # its jobs made nothing
    assert select_records(log, [other])[0] == []


def test_missing_vanilla_and_unfair_rows_are_flagged():
    rows, warnings = comparison_rows([
        _record("vanilla", 100.0), _record("dflash", 150.0, temperature=0.7),
        _record("dflash", 150.0, dataset="humaneval"),
    ])
    by = {(r["method"], r["dataset"]): r for r in rows}
    assert by[("dflash", "gsm8k")]["fair"] is False and by[("dflash", "gsm8k")]["speedup"] == pytest.approx(1.5)
    assert by[("dflash", "humaneval")]["speedup"] is None
    assert any("temperature" in w for w in warnings) and any("no Vanilla row" in w for w in warnings)


def test_runs_compare_cli_formats(matrix_log):
    from adaflash.cli.main import cli

    log, matrix = matrix_log
    runner = CliRunner()
    table = runner.invoke(cli, ["runs", "compare", matrix])
    assert table.exit_code == 0, table.output
    assert "speed-up" in table.stdout and "1.80x" in table.stdout and "Fair comparison" in table.stdout
    markdown = runner.invoke(cli, ["runs", "compare", "--format", "markdown"])
    assert markdown.exit_code == 0 and markdown.stdout.startswith("| method |") and "2.20x" in markdown.stdout
    data = json.loads(runner.invoke(cli, ["runs", "compare", matrix, "--format", "json"]).stdout)
    assert data["rules"] == FAIRNESS_RULES and len(data["rows"]) == 6
    rows = list(csv.DictReader(io.StringIO(runner.invoke(cli, ["runs", "compare", matrix, "--format", "csv"]).stdout)))
    assert {r["method"] for r in rows} == {"vanilla", "dflash", "adaflash"} and "speedup" in rows[0]
    unknown = runner.invoke(cli, ["runs", "compare", "no-such-run"])
    assert unknown.exit_code == 2 and "no run" in unknown.output


def test_runs_export_writes_the_records(matrix_log, tmp_path):
    from adaflash.cli.main import cli

    log, matrix = matrix_log
    out = tmp_path / "m.json"
    result = CliRunner().invoke(cli, ["runs", "export", matrix, "--format", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())
    assert len(records) == 6 and all(r["matrix_run"] == matrix for r in records)
    csv_text = CliRunner().invoke(cli, ["runs", "export", matrix, "--format", "csv"]).stdout
    assert "output_throughput" in csv_text.splitlines()[0]
    md = CliRunner().invoke(cli, ["runs", "export", matrix, "--format", "markdown"]).stdout
    assert "| method |" in md and "Fair comparison" in md


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_exported_results_import_into_another_workspace_with_the_same_comparison(matrix_log, tmp_path, fmt):
    from adaflash.cli.main import cli
    from adaflash.runlog import RunLog

    log, matrix = matrix_log
    out = tmp_path / f"m.{fmt}"
    assert CliRunner().invoke(cli, ["runs", "export", matrix, "--format", fmt, "-o", str(out)]).exit_code == 0
    other = tmp_path / "elsewhere"
    result = CliRunner().invoke(cli, ["--workspace", str(other), "runs", "import", str(out)])
    assert result.exit_code == 0, result.output
    imported = RunLog.open(other)
    (run,) = imported.list_runs(kind="bench")
    def speedups(records):
        return sorted((r["method"], r["concurrency"], r["speedup"]) for r in comparison_rows(records)[0])

    assert speedups(select_records(imported, [run["id"]])[0]) == speedups(select_records(log, [matrix])[0])
    stored = [r["data"] for r in imported.bench_results([run["id"]])]
    assert {r["imported_run_id"] for r in stored} <= {r["id"] for r in log.list_runs(kind="bench")}
    assert "result_id" not in stored[0] and "run_id" not in stored[0]
    back = CliRunner().invoke(cli, ["runs", "import", str(out)])  # into the workspace it came from
    assert back.exit_code == 0 and "nothing imported" in back.output, back.output
    again = CliRunner().invoke(cli, ["--workspace", str(other), "runs", "import", str(out)])
    assert "nothing imported" in again.output and len(imported.bench_results()) == len(stored)


def test_import_of_an_sglang_bench_serving_line(workspace, tmp_path):
    from adaflash.cli.main import cli
    from adaflash.runlog import RunLog

    record = from_sglang(SGLANG_LINE)
    assert record["method"] == "dflash" and record["target"] == "Qwen/Qwen3-8B" and record["dataset"] == "sharegpt"
    assert record["concurrency"] == 32 and record["measured_concurrency"] == 29.7
    assert record["accept_length"] == 4.2 and record["total_token_throughput"] == 7000.0
    assert record["draft"] == "z-lab/Qwen3-8B-DFlash-b16"

    vanilla = {**SGLANG_LINE, "output_throughput": 1500.0,
               "server_info": {**SGLANG_LINE["server_info"], "speculative_algorithm": None}}
    path = tmp_path / "sglang.jsonl"
    path.write_text(json.dumps(vanilla) + "\n" + json.dumps(SGLANG_LINE) + "\n")
    result = CliRunner().invoke(cli, ["runs", "import", str(path), "--dataset", "gsm8k"])
    assert result.exit_code == 0, result.output
    log = RunLog.open(workspace)
    run = log.list_runs(kind="bench")[0]
    stored = [r["data"] for r in log.bench_results([run["id"]])]
    assert [r["method"] for r in stored] == ["vanilla", "dflash"] and {r["dataset"] for r in stored} == {"gsm8k"}
    rows, _ = comparison_rows(select_records(log, [run["id"]])[0])
    assert next(r for r in rows if r["method"] == "dflash")["speedup"] == pytest.approx(2.0)

    weird = {**SGLANG_LINE, "server_info": {**SGLANG_LINE["server_info"], "speculative_algorithm": "WEIRD"}}
    with pytest.raises(ValueError, match="'WEIRD' is none of DFLASH, EAGLE3, EAGLE, NEXTN"):
        from_sglang(weird)
    assert from_sglang(weird, method="osd")["method"] == "osd"

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"completed": 1}\nnot json\n')
    refused = CliRunner().invoke(cli, ["runs", "import", str(bad)])
    assert refused.exit_code == 2 and "bad.jsonl:1" in refused.output


def _adaflash_server_line(cache, **over) -> dict:
    """A bench_serving result against an adaflash server: server_info as its /get_server_info gives it."""
    folder = cache / "models" / "smollm2-135m"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".adaflash-ready").touch()
    info = {"engine": "embedded", "method": "adaflash", "speculative_algorithm": "DFLASH",
            "model_path": str(folder), "target": "smollm2-135m",
            "draft": "smollm2-135m-adaflash", "speculative_draft_model_path": "smollm2-135m-adaflash",
            "drafter_version": 0, "hardware": "cpu-x", "avg_spec_accept_length": 2.9,
            "internal_states": [{"avg_spec_accept_length": 2.9, "last_gen_throughput": 80.0}]}
    return {**SGLANG_LINE, "dataset_name": "custom", "max_concurrency": 4, "concurrency": 3.6, "completed": 8,
            "output_throughput": 210.0, "server_info": info, **over}


def test_bench_serving_of_an_adaflash_server_imports_beside_native_rows_once(workspace, tmp_path, monkeypatch):
    """Method from `method` (not DFLASH), target by its built-in name, concurrency from max_concurrency: the
    imported row shares a group with the native Vanilla row and gets its speed-up; a second import adds nothing."""
    from adaflash.cli.main import cli
    from adaflash.runlog import RunLog

    log = RunLog.open(workspace)
    native = log.create_run("bench", method="vanilla", target="smollm2-135m", dataset="gsm8k")
    log.add_bench_result(native, _record("vanilla", 100.0, concurrency=4))
    cache = tmp_path / "cache"
    monkeypatch.setenv("ADAFLASH_CACHE", str(cache))
    line = _adaflash_server_line(cache)
    no_target = _adaflash_server_line(cache, output_throughput=150.0, max_concurrency=None,
                                      server_info={k: v for k, v in line["server_info"].items() if k != "target"})
    path = tmp_path / "bench_serving.jsonl"
    path.write_text(json.dumps(line) + "\n")
    other = tmp_path / "older.jsonl"
    other.write_text(json.dumps(no_target) + "\n")
    runner = CliRunner()
    first = runner.invoke(cli, ["runs", "import", str(path), "--dataset", "gsm8k"])
    assert first.exit_code == 0 and "imported 1 result(s)" in first.output, first.output
    assert runner.invoke(cli, ["runs", "import", str(other), "--dataset", "gsm8k", "--concurrency", "4"]).exit_code == 0

    again = runner.invoke(cli, ["runs", "import", str(path), "--dataset", "gsm8k"])
    assert again.exit_code == 0 and "nothing imported" in again.output, again.output
    copy = tmp_path / "copy.jsonl"
    copy.write_text(path.read_text() + path.read_text())  # the same line, in another file, twice
    assert "nothing imported" in runner.invoke(cli, ["runs", "import", str(copy), "--dataset", "gsm8k"]).output
    assert len(log.bench_results()) == 3

    shown = runner.invoke(cli, ["runs", "compare", "--format", "json"])
    rows = json.loads(shown.output)["rows"]
    imported = [r for r in rows if r["method"] == "adaflash"]
    assert len(imported) == 2 and {r["target"] for r in rows} == {"smollm2-135m"}
    assert {r["concurrency"] for r in rows} == {4} and {r["group"] for r in rows} == {"standalone"}
    assert sorted(r["speedup"] for r in imported) == [pytest.approx(1.5), pytest.approx(2.1)]
    stored = [r["data"] for r in log.bench_results() if r["method"] == "adaflash"]
    assert {r["draft"] for r in stored} == {"smollm2-135m-adaflash"} and {r["hardware"] for r in stored} == {"cpu-x"}


def test_an_unknown_method_in_a_result_asks_for_method():
    with pytest.raises(ValueError, match="method 'turbo' is none of"):
        from_sglang({**SGLANG_LINE, "method": "turbo"})
    assert from_sglang({**SGLANG_LINE, "method": "turbo"}, method="osd")["method"] == "osd"


def test_runs_compare_into_a_file_or_pipe_prints_every_value_whole(workspace):
    """Piped, the table rendered 200 columns and cut values ("vanil…", "1…")."""
    import subprocess
    import sys

    from adaflash.runlog import RunLog

    log = RunLog.open(workspace)
    target = "a-very-long-target-name-" + "x" * 60
    label = "a label long enough to be cut in a narrow column " * 2
    for method, speed in (("vanilla", 100.0), ("adaflash", 212.5)):
        log.add_bench_result(log.create_run("bench", method=method),
                             {**_record(method, speed, concurrency=16), "target": target, "label": label})
    done = subprocess.run([sys.executable, "-m", "adaflash.cli.main", "--workspace", str(workspace), "runs", "compare"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and target in done.stdout and label.strip() in done.stdout
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("method"))
    assert header.split()[:3] == ["method", "target", "dataset"]
    vanilla = next(line for line in lines if line.startswith("vanilla "))
    adaflash = next(line for line in lines if line.startswith("adaflash "))
    assert "2.12x" in adaflash and " 16 " in vanilla and "100.0" in vanilla
