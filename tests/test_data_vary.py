"""`adaflash data vary`: prompt variants with their integers redrawn, as functions and through the CLI."""

from __future__ import annotations

import json
import random
import re

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.data.prompts import PromptRow, read_prompt_file
from adaflash.data.vary import redraw, vary_prompt, vary_rows, vary_text
from adaflash.runlog import RunLog

CONV = [{"role": "system", "content": "You answer in 3 steps."},
        {"role": "user", "content": "Tom has 12 apples and eats 4."},
        {"role": "assistant", "content": "He has 8."},
        {"role": "user", "content": "And with 12 more?"}]


def test_redraw_stays_in_range_and_never_repeats_the_value():
    for n in (1, 2, 3, 7, 10, 99, 1000):
        values = {redraw(n, random.Random(seed)) for seed in range(300)}
        assert n not in values
        assert min(values) >= max(1, n // 2) and max(values) <= max(2 * n, 3)
    assert {redraw(1, random.Random(seed)) for seed in range(100)} == {2, 3}  # both ends reached
    assert {redraw(0, random.Random(seed)) for seed in range(20)} == {0}


def test_vary_text_redraws_whole_integers_only_and_consistently():
    for seed in range(50):
        text = vary_text("Buy 12 pens at 3.5 each, 1,000 total; 12 left, 0 broken.", random.Random(seed), {})
        match = re.fullmatch(r"Buy (\d+) pens at 3\.5 each, 1,000 total; (\d+) left, 0 broken\.", text)
        assert match, text
        assert match.group(1) == match.group(2) != "12"
        assert 6 <= int(match.group(1)) <= 24



def test_codes_ordinals_other_digits_and_zeros_are_left_alone():
    kept = "Agent 007 came 2nd; ٣ cats; id 1234567890123456789012."
    assert vary_text(kept, random.Random(0), {}) == kept
    zeros = vary_rows([PromptRow("z", "At 0 degrees.", None), PromptRow("one", "I have 1 cat", None)], 5)
    assert zeros.without_numbers == 1 and [r["id"] for r in zeros.rows] == ["z", "one", "one~v1", "one~v2"]
    assert zeros.repeats == 3  # "1" redraws to 2 or 3 only: the ids stay contiguous

def test_vary_prompt_changes_user_turns_only_with_one_draw_per_integer():
    for seed in range(20):
        out = vary_prompt(CONV, random.Random(seed))
        assert [t["role"] for t in out] == [t["role"] for t in CONV]
        assert out[0] == CONV[0] and out[2] == CONV[2]  # system and assistant kept
        new = re.fullmatch(r"Tom has (\d+) apples and eats (\d+)\.", out[1]["content"])
        assert new and new.group(1) != "12" and new.group(2) != "4"
        assert out[3]["content"] == f"And with {new.group(1)} more?"  # same integer, same value across turns
    assert CONV[1]["content"] == "Tom has 12 apples and eats 4."  # the input is not mutated
    assert vary_prompt("plain 5", random.Random(0)) != "plain 5"


ROWS = [PromptRow("a", "Add 2 and 7.", "9"), PromptRow("none", "Say hi.", "hi"), PromptRow("b", CONV, "16")]


def test_vary_rows_ids_order_references_and_counts():
    result = vary_rows(ROWS, 3, seed=1)
    assert [r["id"] for r in result.rows] == ["a", "a~v1", "a~v2", "a~v3", "none", "b", "b~v1", "b~v2", "b~v3"]
    assert [r["reference"] for r in result.rows] == ["9", None, None, None, "hi", "16", None, None, None]
    assert result.rows[0]["prompt"] == "Add 2 and 7." and result.rows[5]["conversations"] == CONV
    assert all("conversations" in r and "prompt" not in r for r in result.rows[5:])
    assert len({r["prompt"] for r in result.rows[:4]}) == 4  # variants differ from the original and each other
    assert result.without_numbers == 1 and result.repeats == 0


def test_vary_rows_is_deterministic_and_per_row():
    assert vary_rows(ROWS, 3, seed=1).rows == vary_rows(ROWS, 3, seed=1).rows
    assert vary_rows(ROWS, 3, seed=1).rows != vary_rows(ROWS, 3, seed=2).rows
    assert vary_rows(ROWS, 3, seed=1).rows[5:] == vary_rows(ROWS[2:], 3, seed=1).rows  # b alone: same variants


def test_vary_rows_counts_repeats_when_draws_run_out():
    for seed in range(20):  # "1" can only become 2 or 3: two variants, redrawn until both are found
        result = vary_rows([PromptRow("cat", "I have 1 cat")], 5, seed=seed)
        assert [r["id"] for r in result.rows] == ["cat", "cat~v1", "cat~v2"]
        assert sorted(r["prompt"] for r in result.rows[1:]) == ["I have 2 cat", "I have 3 cat"]
        assert result.repeats == 3 and result.without_numbers == 0


# -- CLI ------------------------------------------------------------------------------------------


def vary(ws, *args):
    return CliRunner().invoke(cli, ["--workspace", str(ws), "data", "vary", *args], catch_exceptions=False)


@pytest.fixture()
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"id": "conv", "conversations": CONV, "reference": "16"}, {"prompt": "Say hi."},
            {"id": "third", "prompt": "Count to 5."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_writes_the_variants_and_records_the_run(tmp_path, prompts_file):
    out, ws = tmp_path / "out" / "varied.jsonl", tmp_path / "ws"
    result = vary(ws, "--dataset", str(prompts_file), "--variants", "2", "--seed", "3", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "3 prompts -> 7 rows" in result.output and "1 prompts hold no integer" in result.output
    rows = read_prompt_file(out)
    assert [r.id for r in rows] == ["conv", "conv~v1", "conv~v2", f"{prompts_file}:2", "third", "third~v1", "third~v2"]
    assert rows[0].prompt == CONV and rows[0].reference == "16"
    assert [r.reference for r in rows[1:3]] == [None, None] and rows[1].prompt[0] == CONV[0]
    assert rows[1].prompt != rows[0].prompt
    assert [p.name for p in out.parent.iterdir()] == ["varied.jsonl"]  # no temp file left

    (run,) = RunLog.open(ws).list_runs(kind="data")
    assert run["status"] == "finished" and run["dataset"] == str(prompts_file) and run["id"] in result.output
    assert run["config"]["variants"] == 2 and run["config"]["seed"] == 3
    metrics = RunLog.open(ws).last_metrics(run["id"])
    assert metrics["rows"] == 7 and metrics["prompts"] == 3 and metrics["without_numbers"] == 1


def test_cli_num_samples_and_skip(tmp_path, prompts_file):
    out = tmp_path / "out.jsonl"
    result = vary(tmp_path / "ws", "--dataset", str(prompts_file), "--skip", "2", "--num-samples", "1",
                  "--variants", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert [r.id for r in read_prompt_file(out)] == ["third", "third~v1"]


def test_cli_bad_inputs(tmp_path):
    out, ws = tmp_path / "out.jsonl", tmp_path / "ws"
    missing = tmp_path / "missing.jsonl"
    result = vary(ws, "--dataset", str(missing), "--out", str(out))
    assert result.exit_code == 2 and str(missing) in result.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1"}\n{"neither": 2}\n')
    result = vary(ws, "--dataset", str(bad), "--out", str(out))
    assert result.exit_code == 2 and f"{bad}:2" in result.output
    bad.write_text('{"prompt": "1"}\n')
    result = vary(ws, "--dataset", str(bad), "--variants", "0", "--out", str(out))
    assert result.exit_code == 2 and "--variants" in result.output
    assert not out.exists()


def test_cli_refuses_to_write_over_its_input(tmp_path, prompts_file, monkeypatch):
    before = prompts_file.read_text()
    monkeypatch.chdir(prompts_file.parent)
    result = vary(tmp_path / "ws", "--dataset", str(prompts_file), "--out", "./prompts.jsonl")
    assert result.exit_code == 2 and "is the --dataset file itself" in result.output
    assert prompts_file.read_text() == before
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "data", "regenerate", "--dataset",
                                      "prompts.jsonl", "--out", str(prompts_file)])
    assert result.exit_code == 2 and "is the --dataset file itself" in result.output
    assert prompts_file.read_text() == before


def test_cli_failed_write_leaves_no_partial_file(tmp_path, prompts_file, monkeypatch):
    ws = tmp_path / "ws"
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    result = vary(ws, "--dataset", str(prompts_file), "--out", str(blocker / "out.jsonl"))
    assert result.exit_code == 2 and str(blocker) in result.output
    assert blocker.read_text() == "a file, not a folder"

    # a write that breaks after the first row: the old file stays whole, no temp file is left
    from adaflash.data.io import JsonlWriter

    out = tmp_path / "out" / "varied.jsonl"
    out.parent.mkdir()
    out.write_text("old\n")
    real_write = JsonlWriter.write

    def write_once(self, row):
        if self.count:
            raise OSError("disk full")
        real_write(self, row)

    monkeypatch.setattr(JsonlWriter, "write", write_once)
    result = vary(ws, "--dataset", str(prompts_file), "--out", str(out))
    assert result.exit_code == 2 and "disk full" in result.output
    assert out.read_text() == "old\n" and [p.name for p in out.parent.iterdir()] == ["varied.jsonl"]
    runs = RunLog.open(ws).list_runs(kind="data")
    assert [r["status"] for r in runs] == ["failed"]  # the folder inside a file was refused before any run
    assert "disk full" in runs[0]["note"]
