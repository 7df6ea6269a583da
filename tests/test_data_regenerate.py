"""`adaflash data regenerate` on a tiny random target, through the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.engine.config import EngineConfig
from adaflash.runlog import RunLog

PROMPTS = [
    {"id": "conv", "conversations": [{"role": "user", "content": "What is 2 + 3?"},
                                     {"role": "assistant", "content": "5 (the dataset's answer, dropped)"}],
     "reference": "5"},
    {"id": "plain", "prompt": "Name a colour."},
    {"id": "third", "conversations": [{"role": "user", "content": "Count to three."}]},
]


def regen(ws: Path, *args: str):
    return CliRunner().invoke(cli, ["--workspace", str(ws), "data", "regenerate", *args], catch_exceptions=False)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture()
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    return path


def test_regenerate_keeps_the_exact_prompt_and_the_answer(tmp_path, tiny_llama, tiny_target, prompts_file):
    from adaflash.engine.engine import Engine
    from adaflash.engine.params import Request, SamplingParams

    out = tmp_path / "regen" / "out.jsonl"
    ws = tmp_path / "ws"
    result = regen(ws, "--target", str(tiny_llama), "--dataset", str(prompts_file), "--num-samples", "3",
                   "--max-new-tokens", "6", "--batch-size", "2", "--out", str(out), "--json",
                   "--dtype", "float32")  # the references below: the float32 target
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    rows = read_rows(out)
    assert [r["id"] for r in rows] == ["conv", "plain", "third"]
    assert summary["rows"] == 3 and summary["skipped"] == 0

    # the same prompts through a fresh engine, greedily: the rows must hold exactly this
    engine = Engine(tiny_target, config=EngineConfig(max_batch=2))
    texts = [tiny_target.render([{"role": "user", "content": "What is 2 + 3?"}]),
             tiny_target.render("Name a colour."),
             tiny_target.render([{"role": "user", "content": "Count to three."}])]
    expected = engine.generate([Request(tiny_target.encode(t), SamplingParams(max_new_tokens=6), prompt_text=t)
                                for t in texts])
    for row, text, out_ref in zip(rows, texts, expected):
        assert row["prompt_text"] == text
        assert "<|im_start|>assistant" in text  # the chat template was applied
        assert row["output_ids"] == out_ref.output_ids
        assert row["response"] == out_ref.text == tiny_target.decode(row["output_ids"])
        assert row["conversations"][-1] == {"role": "assistant", "content": row["response"]}
        assert all(turn["role"] == "user" for turn in row["conversations"][:-1])
        assert row["meta"]["completion_tokens"] == len(row["output_ids"])
        assert row["meta"]["spec_accept_length"] == 1.0  # vanilla: one token per target step
        assert row["finish_reason"] in ("stop", "length")
    assert rows[0]["conversations"][0] == {"role": "user", "content": "What is 2 + 3?"}
    assert rows[0]["reference"] == "5"
    assert rows[1]["conversations"][:-1] == [{"role": "user", "content": "Name a colour."}]

    run = RunLog.open(ws).get_run(summary["run_id"])
    assert run["kind"] == "data" and run["status"] == "finished" and run["target"] == str(tiny_llama)
    longest = max(len(tiny_target.encode(t)) for t in texts)
    assert run["config"]["max_len"] == longest + 6 + 256  # the KV cache is sized to the data
    metrics = RunLog.open(ws).last_metrics(summary["run_id"])
    assert metrics["accept_length"] == 1.0
    assert metrics["completion_tokens"] == sum(len(r["output_ids"]) for r in rows)
    assert metrics["output_throughput"] > 0
    assert [p.name for p in out.parent.iterdir()] == ["out.jsonl"]  # no temp file left


def test_regenerate_no_chat_num_samples_and_too_long_prompts(tmp_path, tiny_llama, prompts_file):
    rows = PROMPTS[1:2] + [{"id": "huge", "prompt": "word " * 2500}] + PROMPTS[2:]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    result = regen(tmp_path / "ws", "--target", str(tiny_llama), "--dataset", str(path), "--num-samples", "2",
                   "--max-new-tokens", "4", "--no-chat", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "skipped huge" in result.output and "exceeds the context" in result.output
    written = read_rows(out)
    assert [r["id"] for r in written] == ["plain"]
    assert written[0]["prompt_text"] == "Name a colour."


def test_regenerate_bad_inputs(tmp_path, tiny_llama):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{broken\n')
    out = tmp_path / "out.jsonl"
    result = regen(tmp_path, "--target", str(tiny_llama), "--dataset", str(bad), "--out", str(out))
    assert result.exit_code == 2 and f"{bad}:2" in result.output
    result = regen(tmp_path, "--target", str(tiny_llama), "--dataset", str(bad), "--method", "dflash",
                   "--out", str(out))
    assert result.exit_code == 2 and "needs --draft" in result.output
    assert not out.exists()


def test_shards_split_the_prompts_and_compact_gzip_rows_hold_what_training_reads(tmp_path, tiny_llama,
                                                                                  prompts_file):
    from adaflash.data.io import read_jsonl

    ws = tmp_path / "ws"
    outs = []
    for index in range(2):
        out = tmp_path / f"shard{index}.jsonl.gz"
        result = regen(ws, "--target", str(tiny_llama), "--dataset", str(prompts_file), "--max-new-tokens", "4",
                       "--shard", f"{index}/2", "--compact", "--out", str(out), "--json")
        assert result.exit_code == 0, result.output
        outs.append([row for _, row in read_jsonl(out)])
    assert [r["id"] for r in outs[0]] == ["conv", "third"] and [r["id"] for r in outs[1]] == ["plain"]
    row = outs[0][0]
    assert set(row) == {"id", "prompt_text", "output_ids", "finish_reason", "meta"}
    assert len(row["output_ids"]) == row["meta"]["completion_tokens"] > 0
    bad = regen(ws, "--target", str(tiny_llama), "--dataset", str(prompts_file), "--shard", "2/2",
                "--out", str(tmp_path / "x.jsonl"))
    assert bad.exit_code != 0 and "--shard wants I/N" in bad.output


def test_a_spent_time_budget_keeps_the_answered_rows_and_resume_answers_only_the_rest(tmp_path, tiny_llama,
                                                                                     prompts_file, monkeypatch):
    """The budget runs out after the first answer: OUT holds it, OUT.partial keeps it, and --resume
    answers the other two without answering the first again."""
    from adaflash.data import regenerate as regen_module

    ws, out = tmp_path / "ws", tmp_path / "out.jsonl"
    clock = iter([0.0, 0.0] + [1e9] * 1000)  # start, first check, then the budget is spent
    real_step = regen_module.Engine.step
    answered: list[str] = []

    def step(engine):
        events = real_step(engine)
        answered.extend(e.rid for e in events if e.output is not None)
        return events

    monkeypatch.setattr(regen_module.Engine, "step", step)
    monkeypatch.setattr(regen_module.time, "monotonic", lambda: next(clock))
    first = regen(ws, "--target", str(tiny_llama), "--dataset", str(prompts_file), "--max-new-tokens", "3",
                  "--batch-size", "1", "--max-minutes", "1", "--out", str(out), "--json")
    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout)
    assert summary["unfinished"] == 3 - summary["rows"] and summary["unfinished"] > 0
    kept = [r["id"] for r in read_rows(out)]
    assert kept == answered and Path(str(out) + ".partial").is_file()
    monkeypatch.undo()
    answered.clear()
    monkeypatch.setattr(regen_module.Engine, "step", step)
    second = regen(ws, "--target", str(tiny_llama), "--dataset", str(prompts_file), "--max-new-tokens", "3",
                   "--batch-size", "1", "--resume", "--out", str(out), "--json")
    assert second.exit_code == 0, second.output
    assert [r["id"] for r in read_rows(out)] == ["conv", "plain", "third"]
    assert not set(answered) & set(kept)  # nothing answered twice
    assert not Path(str(out) + ".partial").exists()


def test_procs_answer_every_prompt_once_into_one_output_as_one_process_does(tmp_path, tiny_llama, prompts_file):
    """Two real child processes split the prompts; OUT holds each answer once, the same answers one
    process gives, and nothing of the shards is left beside it."""
    from adaflash.data.io import read_jsonl

    ws = tmp_path / "ws"
    common = ("--target", str(tiny_llama), "--dataset", str(prompts_file), "--max-new-tokens", "4", "--compact",
              "--device", "cpu", "--json")
    one = regen(ws, *common, "--out", str(tmp_path / "one.jsonl.gz"))
    assert one.exit_code == 0, one.output
    out = tmp_path / "many" / "answers.jsonl.gz"
    many = regen(ws, *common, "--procs", "2", "--out", str(out))
    assert many.exit_code == 0, many.output
    summary = json.loads(many.stdout)
    assert (summary["procs"], summary["rows"], summary["new_rows"], len(summary["shard_runs"])) == (2, 3, 3, 2)
    assert summary["completion_tokens"] == 12
    by_id = {row["id"]: row["output_ids"] for _, row in read_jsonl(out)}
    assert by_id == {row["id"]: row["output_ids"] for _, row in read_jsonl(tmp_path / "one.jsonl.gz")}
    assert sorted(p.name for p in out.parent.iterdir()) == ["answers.jsonl.gz"]
    log = RunLog(ws / "runlog.sqlite")
    parent = log.get_run(summary["run_id"])
    assert parent["status"] == "finished" and parent["config"]["procs"] == 2
    assert {s: log.get_run(s)["status"] for s in summary["shard_runs"]} == dict.fromkeys(summary["shard_runs"], "finished")


def test_procs_refuses_shard_and_names_the_failed_shard(tmp_path, tiny_llama, prompts_file):
    ws, out = tmp_path / "ws", tmp_path / "out.jsonl"
    both = regen(ws, "--target", str(tiny_llama), "--dataset", str(prompts_file), "--procs", "2", "--shard", "0/2",
                 "--out", str(out))
    assert both.exit_code != 0 and "leave out --shard" in both.output
    failed = regen(ws, "--target", str(tiny_llama), "--dataset", str(prompts_file), "--procs", "2",
                   "--method", "eagle3", "--out", str(out))
    assert failed.exit_code != 0
    assert "shard 0/2 failed" in failed.output or "shard 1/2 failed" in failed.output
    assert "eagle3" in failed.output and "--resume" in failed.output
    assert not out.exists()


def test_procs_resume_keeps_a_finished_shard_and_runs_the_others(tmp_path, tiny_llama, prompts_file):
    """After a run whose other shard failed, shard 0's OUT stays; --resume merges it as it is (no
    process answers it again) with what shard 1 answers now."""
    from adaflash.data.io import read_jsonl, write_jsonl_atomic
    from adaflash.data.regenerate_procs import shards_of

    out = tmp_path / "answers.jsonl"
    kept = {"id": "conv", "prompt_text": "kept", "output_ids": [7, 7], "finish_reason": None, "meta": {}}
    write_jsonl_atomic(shards_of(out, 2)[0].out, [kept])
    result = regen(tmp_path / "ws", "--target", str(tiny_llama), "--dataset", str(prompts_file), "--max-new-tokens",
                   "3", "--compact", "--device", "cpu", "--procs", "2", "--resume", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["rows"], summary["new_rows"], summary["resumed_rows"]) == (2, 1, 1)
    rows = {row["id"]: row for _, row in read_jsonl(out)}
    assert rows["conv"] == kept and set(rows) == {"conv", "plain"}


def test_procs_read_a_summary_larger_than_a_pipe_holds(tmp_path):
    """A shard's --json summary lists every skipped prompt: hundreds of KB on a large dataset. Read from a
    pipe only after the process ends, it filled the pipe and the process never ended (seen on an H200 with
    8 shards). The summaries now go through files; a hang fails this test after 60 s instead of blocking."""
    import threading

    from adaflash.data.regenerate_procs import run_processes, shards_of

    shards = shards_of(tmp_path / "answers.jsonl", 2)
    script = ("import json, sys; print(json.dumps({'rows': int(sys.argv[1]), "
              "'skipped_reasons': {f'p{i}': 'prompt longer than --max-len' for i in range(20000)}}))")
    got: list = []
    worker = threading.Thread(target=lambda: got.append(
        run_processes(lambda s: [sys.executable, "-c", script, str(s.index)], shards, lambda done: None)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the shard processes blocked writing their summaries"
    assert [s["rows"] for s in got[0]] == [0, 1]
    assert all(len(s["skipped_reasons"]) == 20000 for s in got[0])
