"""`adaflash eval`: τ and throughput of several methods on the same prompts, recorded in one run."""

from __future__ import annotations

import json

from click.testing import CliRunner

from adaflash.cli.main import cli


def test_eval_measures_each_method_and_records_one_run(workspace, tiny_llama, tmp_path):
    from adaflash.runlog import RunLog

    draft = tmp_path / "d"
    made = CliRunner().invoke(cli, ["draft", "new", "--method", "dflash", "--length-head", "--target", str(tiny_llama),
                                    "--block-size", "4", "--out", str(draft)])
    assert made.exit_code == 0, made.output
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("What is 2 + 3?", "Name a prime.")))
    result = CliRunner().invoke(cli, ["eval", "--target", str(tiny_llama), "--method", "vanilla",
                                      "--method", f"dflash={draft}", "--method", f"adaflash={draft}",
                                      "--dataset", str(prompts), "--num-prompts", "2", "--batch-size", "2",
                                      "--max-new-tokens", "6", "--device", "cpu", "--length-policy", "cost",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["method"] for r in rows] == ["vanilla", "dflash", "adaflash"]
    assert rows[0]["speedup"] == 1.0 and rows[0]["accept_length"] == 1.0
    assert all(r["completed"] == 2 and r["total_output_tokens"] > 0 for r in rows)
    assert all(1.0 <= r["accept_length"] <= 4.0 for r in rows[1:])
    runs = RunLog.open(workspace).list_runs(kind="bench")
    stored = RunLog.open(workspace).bench_results([runs[0]["id"]])
    assert len(runs) == 1 and len(stored) == 3
    # summarized as the HTTP client's results are: inter-token latencies and spreads included
    assert all(r["data"]["median_itl_ms"] > 0 and r["data"]["std_e2e_latency_ms"] is not None and r["data"]["failed"] == 0
               for r in stored)
    bad = CliRunner().invoke(cli, ["eval", "--target", str(tiny_llama), "--method", "vanilla", "--dataset", "nowhere"])
    assert bad.exit_code == 2 and "--dataset nowhere" in bad.output


def test_eval_checks_its_methods_before_anything_loads(workspace, tiny_llama):
    """A repeated method gave two speed-ups against two Vanilla rows; eval has no --draft option to point at."""
    from adaflash.runlog import RunLog

    cases = [
        (["--method", "vanilla", "--method", "vanilla"], "--method vanilla is given twice"),
        (["--method", "eagle3"], "--method eagle3 needs --method eagle3=DIR"),
        (["--method", "vanilla=somewhere"], "vanilla runs without a drafter"),
        (["--method", "nonsense"], "--method must be one of"),
    ]
    for methods, expected in cases:
        result = CliRunner().invoke(cli, ["eval", "--target", str(tiny_llama), *methods, "--dataset", "nowhere"])
        assert result.exit_code == 2 and expected in result.output, (methods, result.output)
    assert RunLog.open(workspace).list_runs() == []  # mistakes in the arguments are not runs
