"""The benchmark client against a live tiny embedded server, and its metric arithmetic."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from adaflash.bench.metrics import RequestResult, compute_metrics, gsm8k_correct, last_number, percentile
from adaflash.engine.config import EngineConfig

GSM8K_ROWS = [
    {"id": f"gsm8k-test-{i:05d}",
     "conversations": [{"role": "user", "content": q}, {"role": "assistant", "content": f"... #### {a}"}],
     "reference": str(a)}
    for i, (q, a) in enumerate([("What is 2+3?", 5), ("Tom has 4 apples and eats 1. How many left?", 3),
                                ("A box holds 12 eggs. How many in 2 boxes?", 24), ("What is 10 - 7?", 3),
                                ("Half of 18?", 9)])
]


# The module-scoped fixtures below are built once: keep this module's tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_bench_client")


@pytest.fixture(scope="module")
def live(tiny_llama):
    from adaflash.engine.build import build_engine
    from adaflash.serve.running import RunningServer
    from adaflash.serve.server import EmbeddedServer

    engine = build_engine(str(tiny_llama), "vanilla",
                          config=EngineConfig(max_batch=4, max_len=256), device="cpu")
    running = RunningServer(EmbeddedServer(engine, target=str(tiny_llama), hardware="test-cpu"))
    yield running
    running.stop()


def _prepare(workspace: Path) -> None:
    (workspace / "data").mkdir(parents=True, exist_ok=True)
    (workspace / "data" / "gsm8k_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))


def test_bench_records_sglang_metrics_in_the_run_log(live, workspace, tiny_llama):
    from adaflash.cli.main import cli
    from adaflash.runlog import RunLog

    _prepare(workspace)
    result = CliRunner().invoke(cli, ["bench", "--base-url", live.url, "--dataset", "gsm8k", "--num-prompts", "4",
                                      "--concurrency", "2", "--max-new-tokens", "6", "--warmup", "1",
                                      "--eval-accuracy", "--label", "smoke", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    for key in ("output_throughput", "request_throughput", "input_throughput", "total_throughput",
                "total_token_throughput", "completed", "duration", "total_input_tokens", "total_output_tokens",
                "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms",
                "median_e2e_latency_ms", "p99_e2e_latency_ms", "max_concurrency", "accept_length", "method", "target",
                "draft", "dataset", "concurrency", "num_prompts", "temperature", "max_new_tokens", "label", "accuracy",
                "hardware"):
        assert key in record, key
    assert record["completed"] == 4 and record["failed"] == 0
    assert record["method"] == "vanilla" and record["target"] == str(tiny_llama) and record["dataset"] == "gsm8k"
    assert record["concurrency"] == 2 and record["max_new_tokens"] == 6 and record["hardware"] == "test-cpu"
    assert record["accept_length"] == pytest.approx(1.0)
    assert 0.0 <= record["accuracy"] <= 1.0
    assert record["total_output_tokens"] <= 4 * 6 and record["output_throughput"] > 0
    assert record["median_ttft_ms"] > 0 and record["p99_e2e_latency_ms"] >= record["median_e2e_latency_ms"]

    log = RunLog.open(workspace)
    run = log.get_run(record["run_id"])
    assert run["kind"] == "bench" and run["status"] == "finished" and run["dataset"] == "gsm8k"
    stored = log.bench_results([run["id"]])
    assert len(stored) == 1 and stored[0]["data"]["output_throughput"] == record["output_throughput"]
    assert stored[0]["concurrency"] == 2 and stored[0]["label"] == "smoke"


def test_bench_reads_a_prompt_file_without_chat(live, workspace, tmp_path):
    from adaflash.cli.main import cli

    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "Hello"}\n{"prompt": "Goodbye"}\n')
    result = CliRunner().invoke(cli, ["bench", "--base-url", live.url, "--dataset", str(prompts), "--num-prompts", "2",
                                      "--max-new-tokens", "3", "--warmup", "0", "--no-chat", "--no-stream", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["dataset"] == "mine" and record["completed"] == 2 and record["stream"] is False
    table = CliRunner().invoke(cli, ["bench", "--base-url", live.url, "--dataset", str(prompts), "--num-prompts", "2",
                                     "--max-new-tokens", "3", "--warmup", "0", "--no-chat"])
    assert table.exit_code == 0, table.output
    line = next(line for line in table.output.splitlines() if line.startswith("server engine:"))
    assert "rows a step" in line and "prefill" in line  # where our server's engine spent the measured requests


def test_bench_errors_are_clear(live, workspace):
    from adaflash.cli.main import cli

    missing = CliRunner().invoke(cli, ["bench", "--base-url", live.url, "--dataset", "humaneval"])
    assert missing.exit_code == 2 and "data prepare humaneval" in missing.output
    down = CliRunner().invoke(cli, ["bench", "--base-url", "http://127.0.0.1:9", "--dataset", "gsm8k"])
    assert down.exit_code == 2 and "cannot reach" in down.output


def test_metrics_follow_bench_serving_definitions():
    results = [
        RequestResult("a", True, prompt_tokens=10, output_tokens=5, ttft=0.1, latency=0.5, itl=[0.1] * 4, verify_ct=2,
                      proposed=8, correct=3),
        RequestResult("b", True, prompt_tokens=20, output_tokens=1, ttft=0.2, latency=0.2, verify_ct=1),
        RequestResult("c", False, error="boom"),
    ]
    m = compute_metrics(results, duration=2.0)
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["output_throughput"] == pytest.approx(3.0) and m["request_throughput"] == pytest.approx(1.0)
    assert m["total_throughput"] == pytest.approx(18.0) and m["input_throughput"] == pytest.approx(15.0)
    assert m["mean_tpot_ms"] == pytest.approx(100.0)  # only requests with > 1 token count
    assert m["median_ttft_ms"] == pytest.approx(150.0) and m["p99_ttft_ms"] == pytest.approx(199.0)
    assert m["accept_length"] == pytest.approx(6 / 3) and m["accept_rate"] == pytest.approx(3 / 8)
    assert m["std_e2e_latency_ms"] == pytest.approx(150.0)
    empty = compute_metrics([RequestResult("x", False)], duration=1.0)
    assert empty["completed"] == 0 and empty["median_ttft_ms"] is None and empty["accept_length"] is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and math.isclose(percentile([0, 10], 99), 9.9)


def test_gsm8k_answer_matching():
    assert last_number("so 1,234 apples; the answer is 1,234.") == 1234.0
    assert gsm8k_correct("She pays $18 in total.", "18")
    assert gsm8k_correct("#### 72", "#### 72")
    assert not gsm8k_correct("about 17 or 19", "18")
    assert not gsm8k_correct("no number here", "3")
    assert gsm8k_correct("-4.0", -4)


def test_bench_speaks_the_openai_api_too(live, workspace):
    """--api openai: the same questions through /v1/completions (what vLLM serves) give the same token
    counts as through /generate, with TTFT and ITL from the stream; the model comes from /v1/models."""
    from adaflash.cli.main import cli

    _prepare(workspace)
    args = ["bench", "--base-url", live.url, "--dataset", "gsm8k", "--num-prompts", "3", "--concurrency", "2",
            "--max-new-tokens", "5", "--warmup", "0", "--ignore-eos", "--json"]
    native = json.loads(CliRunner().invoke(cli, args).stdout)
    result = CliRunner().invoke(cli, [*args, "--api", "openai", "--method", "vanilla"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["api"] == "openai" and record["backend"] == "openai" and record["completed"] == 3
    assert record["total_output_tokens"] == native["total_output_tokens"] == 3 * 5
    assert record["median_ttft_ms"] > 0 and record["median_itl_ms"] > 0 and record["method"] == "vanilla"
    unlabelled = json.loads(CliRunner().invoke(cli, [*args, "--api", "openai", "--no-stream"]).stdout)
    assert unlabelled["method"] is None and unlabelled["total_output_tokens"] == 15  # no /get_server_info to read
    wrong = CliRunner().invoke(cli, ["bench", "--base-url", live.url + "/nothing", "--dataset", "gsm8k", "--api", "openai"])
    assert wrong.exit_code == 2 and "/v1/models answered HTTP 404" in wrong.output


def test_a_partial_native_chunk_is_read_for_its_counts_alone():
    """A partial chunk gives its meta_info (compact or spaced JSON, a text that quotes the key itself); a last
    chunk, an error, or one without a count is decoded whole."""
    import json

    from adaflash.bench.client import _native_chunk

    meta = {"id": "r", "completion_tokens": 3, "finish_reason": None}
    tricky = 'say "meta_info": {"completion_tokens": 99}'
    for dumps in (json.dumps, lambda o: json.dumps(o, separators=(",", ":"))):
        partial = dumps({"text": tricky, "output_ids": [1, 2, 3], "meta_info": meta, "index": 2}).encode()
        assert _native_chunk(partial) == {"meta_info": meta}
        last = {"text": tricky, "output_ids": [1, 2, 3, 4], "meta_info": {**meta, "finish_reason": {"type": "length"}}}
        assert _native_chunk(dumps(last).encode()) == last
    error = {"error": {"message": "boom"}}
    assert _native_chunk(json.dumps(error).encode()) == error
    no_count = {"text": "a", "meta_info": {"finish_reason": None}}
    assert _native_chunk(json.dumps(no_count).encode()) == no_count


def test_length_spread_sends_each_prompt_its_own_budget(live, workspace, tmp_path):
    """`bench --length-spread`: each request asks for its prompt's own max_new_tokens (`answer_budget`, by id),
    so with --ignore-eos the answers add up to the budgets; the record says the spread."""
    from adaflash.bench.prompts import answer_budget
    from adaflash.cli.main import cli

    rows = [{"id": f"s{i}", "prompt": f"Say {i}"} for i in range(4)]
    prompts = tmp_path / "spread.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(cli, ["bench", "--base-url", live.url, "--dataset", str(prompts), "--num-prompts", "4",
                                      "--max-new-tokens", "8", "--length-spread", "0.5", "--ignore-eos", "--no-chat",
                                      "--warmup", "0", "--concurrency", "2", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["length_spread"] == 0.5
    assert record["total_output_tokens"] == sum(answer_budget(r["id"], 8, 0.5) for r in rows)
