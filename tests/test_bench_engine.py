"""`adaflash bench engine`: every method and transformers' generate() side by side on a tiny target."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

METHODS = ("vanilla", "dflash", "adaflash", "eagle3", "mtp")


# The module-scoped fixtures below are built once: keep this module's tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_bench_engine")


@pytest.fixture(scope="module")
def drafts(tiny_llama, tmp_path_factory):
    """Untrained drafters through `adaflash draft new`, one sub-folder per method (the --draft-dir layout)."""
    from adaflash.cli.main import cli

    root = tmp_path_factory.mktemp("drafts")
    made = {"dflash": ["--method", "dflash"], "adaflash": ["--method", "dflash", "--length-head"],
            "eagle3": ["--method", "eagle3", "--steps", "3"], "mtp": ["--method", "mtp", "--steps", "3"]}
    for name, args in made.items():
        result = CliRunner().invoke(cli, ["draft", "new", *args, "--target", str(tiny_llama), "--block-size", "4",
                                          "--out", str(root / name)])
        assert result.exit_code == 0, result.output
    return root


@pytest.fixture()
def prompt_file(tmp_path):
    rows = [{"id": "q0", "prompt": "What is 2 + 3?"}, {"id": "q1", "prompt": "Name three primes."},
            {"id": "q2", "prompt": "unused"}]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _invoke(*args: str):
    from adaflash.cli.main import cli

    return CliRunner().invoke(cli, ["bench", "engine", *args])


def test_every_method_and_hf_side_by_side_recorded_and_lossless(workspace, tiny_llama, drafts, prompt_file):
    from adaflash.runlog import RunLog

    result = _invoke("--target", str(tiny_llama), "--methods", ",".join(reversed(METHODS)), "--draft-dir", str(drafts),
                     "--prompts", str(prompt_file), "--num-prompts", "2", "--batch-sizes", "1,2",
                     "--max-new-tokens", "6", "--device", "cpu", "--dtype", "float32", "--compare-hf", "--label", "tiny",
                     "--warmup", "full", "--format", "json")  # float32: transformers' bf16 is not row-invariant
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    run_id, records = out["run_id"], out["records"]
    cells = {(r["method"], r["concurrency"]): r for r in records}
    expected = {(m, b) for m in METHODS for b in (1, 2)} | {("hf-generate", 1), ("hf-generate", 2),
                                                           ("hf-prompt-lookup", 1)}
    assert set(cells) == expected
    for record in records:
        assert record["completed"] == 2 and record["num_prompts"] == 2 and record["batch_size"] == record["concurrency"]
        assert record["output_throughput"] > 0 and 0 < record["total_output_tokens"] <= 12
        assert record["accept_length"] >= 1.0 and record["matrix_run"] == run_id
        assert record["max_new_tokens"] == 6 and record["temperature"] == 0.0 and record["label"] == "tiny"
        assert record["hardware"] == "cpu" and record["warmup"] == "full"
    assert cells[("dflash", 1)]["draft"].endswith("dflash") and cells[("adaflash", 2)]["draft"].endswith("adaflash")
    assert {r["backend"] for r in records} == {"embedded", "transformers"}
    assert {r["kernels"] for r in records if r["backend"] == "embedded"} == {"eager"}  # a CPU: no Triton kernels
    assert {r["kernels"] for r in records if r["backend"] == "transformers"} == {None}
    # Lossless: every method (and transformers on the same folder) matches our greedy Vanilla token for token.
    assert cells[("vanilla", 1)]["mismatches"] is None  # the reference itself
    for key, record in cells.items():
        if key != ("vanilla", 1):
            assert record["mismatches"] == 0 and record["identical"] is True, key
    assert cells[("vanilla", 2)]["identical_reference"] == "vanilla@b1"
    assert cells[("mtp", 2)]["identical_reference"] == "vanilla@b2"
    assert cells[("hf-generate", 1)]["accept_length"] == 1.0
    assert cells[("vanilla", 1)]["accept_by_position"] is None
    shares = cells[("dflash", 2)]["accept_by_position"]
    assert shares and all(share is None or 0 <= share <= 1 for share in shares)
    # Vanilla heads every batch size in the printed rows, transformers' rows close it.
    shown = [(r["method"], r["batch"]) for r in out["rows"]]
    assert shown[0] == ("vanilla", 1) and shown[5:7] == [("hf-generate", 1), ("hf-prompt-lookup", 1)]
    assert all(r["identical"] in ("yes", "ref") for r in out["rows"])

    log = RunLog.open(workspace)
    run = log.get_run(run_id)
    assert run["kind"] == "bench-matrix" and run["status"] == "finished" and run["note"].startswith("13/13")
    assert run["config"]["methods"][0] == "vanilla" and run["config"]["batch_sizes"] == [1, 2]
    stored = log.bench_results([run_id])
    assert len(stored) == 13 and all(r["output_throughput"] > 0 for r in stored)
    assert {r["concurrency"] for r in stored} == {1, 2}

    from adaflash.cli.main import cli

    compared = CliRunner().invoke(cli, ["runs", "compare", run_id, "--format", "json"])
    assert compared.exit_code == 0, compared.output
    rows = {(r["method"], r["concurrency"]): r for r in json.loads(compared.stdout)["rows"]}
    assert set(rows) == expected
    assert rows[("vanilla", 2)]["speedup"] == 1.0
    assert rows[("hf-generate", 2)]["speedup"] > 0 and rows[("hf-prompt-lookup", 1)]["speedup"] > 0
    assert all(r["fair"] for r in rows.values())
    table = CliRunner().invoke(cli, ["runs", "compare"])  # the latest run is the default
    assert table.exit_code == 0 and run_id in table.stdout and "hf-generate" in table.stdout


@pytest.mark.parametrize("args, message", [
    (["--methods", "vanilla,medusa"], "--methods: unknown method(s) medusa"),
    (["--methods", ","], "--methods is empty"),
    (["--methods", "vanilla,dflash"], "no drafter for dflash"),
    (["--methods", "vanilla", "--batch-sizes", "1,x"], "--batch-sizes must be comma-separated integers"),
    (["--methods", "vanilla", "--batch-sizes", "0,8"], "--batch-sizes values must be ≥ 1"),
    (["--methods", "dflash", "--draft", "dflash"], "--draft takes METHOD=DIR"),
    (["--methods", "dflash", "--draft", "dflash=/nonexistent/d"], "--draft dflash=/nonexistent/d: no drafter there"),
    (["--methods", "vanilla", "--device", "nodevice"], "on --device nodevice: cannot load it"),
    (["--methods", "vanilla", "--draft", "dflash=/d"], "--draft dflash=/d: not in --methods vanilla"),
    (["--methods", "vanilla", "--draft-dir", "/nonexistent/drafts"], "--draft-dir /nonexistent/drafts: no such folder"),
])
def test_bad_inputs_name_the_option(workspace, tiny_llama, prompt_file, args, message):
    result = _invoke("--target", str(tiny_llama), "--prompts", str(prompt_file), *args)
    assert result.exit_code == 2
    assert message in result.output


def test_draft_dir_layout_and_mismatched_drafter(workspace, tiny_llama, drafts, prompt_file, tmp_path):
    from adaflash.bench.engine_spec import EngineBenchError, resolve_drafts

    (tmp_path / "d" / "adaflash-init").mkdir(parents=True)
    (tmp_path / "d" / "adaflash-init" / "config.json").write_text("{}")
    assert resolve_drafts(["vanilla", "adaflash"], str(tmp_path / "d"), {}) == {
        "adaflash": str(tmp_path / "d" / "adaflash-init")}
    with pytest.raises(EngineBenchError, match="--draft-dir .* holds no eagle3/"):
        resolve_drafts(["eagle3"], str(tmp_path / "d"), {})
    # a built-in drafter's name stands for its folder inside the package
    from adaflash.models.builtin_drafters import BUILTIN_DRAFTERS

    assert resolve_drafts(["dflash"], None, {"dflash": "smollm2-135m-dflash"}) == {
        "dflash": str(BUILTIN_DRAFTERS["smollm2-135m-dflash"].folder)}
    with pytest.raises(EngineBenchError, match="built-in drafter"):
        resolve_drafts(["dflash"], None, {"dflash": str(tmp_path / "nowhere")})
    # A DFlash drafter without a length head cannot run AdaFlash: caught before anything is measured.
    result = _invoke("--target", str(tiny_llama), "--prompts", str(prompt_file), "--methods", "vanilla,adaflash",
                     "--draft", f"adaflash={drafts / 'dflash'}", "--device", "cpu")
    assert result.exit_code == 2
    assert f"--draft adaflash={drafts / 'dflash'}" in result.output and "length head" in result.output


def test_length_rate_and_min_length_reach_the_engine_and_the_run_config(workspace, tiny_llama, drafts, prompt_file,
                                                                         monkeypatch):
    import adaflash.engine.build as build
    from adaflash.runlog import RunLog

    seen: list[dict] = []
    real = build.build_engine

    def spy(target, method="vanilla", draft=None, **kw):
        seen.append({"method": method, **kw["config"].to_json()})
        return real(target, method, draft, **kw)

    monkeypatch.setattr(build, "build_engine", spy)
    result = _invoke("--target", str(tiny_llama), "--methods", "vanilla,adaflash", "--draft-dir", str(drafts),
                     "--prompts", str(prompt_file), "--num-prompts", "1", "--max-new-tokens", "4", "--device", "cpu",
                     "--length-rate", "1.7", "--min-length", "3", "--length-policy", "cost", "--format", "json")
    assert result.exit_code == 0, result.output
    assert {s["method"] for s in seen} == {"vanilla", "adaflash"}
    assert all(s["length_rate"] == 1.7 and s["min_length"] == 3 and s["length_policy"] == "cost" for s in seen)
    run = RunLog.open(workspace).get_run(json.loads(result.stdout)["run_id"])
    settings = run["config"]["engine_config"]
    assert settings["length_rate"] == 1.7 and settings["min_length"] == 3 and settings["length_policy"] == "cost"
    bad = _invoke("--target", str(tiny_llama), "--prompts", str(prompt_file), "--length-rate", "0")
    assert bad.exit_code == 2 and "--length-rate" in bad.output
    bad = _invoke("--target", str(tiny_llama), "--prompts", str(prompt_file), "--length-policy", "fastest")
    assert bad.exit_code == 2 and "--length-policy" in bad.output


def test_every_graph_is_captured_before_the_warm_up(workspace, tiny_llama, drafts, prompt_file, monkeypatch):
    """Where graphs replay, each engine captures every shape it can meet before its warm-up, so the timed run
    (AdaFlash's rare re-timing widths included) captures nothing on the clock."""
    import adaflash.engine.build as build
    from tests.test_engine_graphs import _RecordingRunner

    engines = []
    real = build.build_engine

    def with_graphs(target, method="vanilla", draft=None, **kw):
        engine = real(target, method, draft, **kw)
        engine.graphs, engine.padded = _RecordingRunner(), True  # graphs "replay" (eagerly, keys recorded)
        capture = engine.capture_graphs
        engine.captured = None

        def recorded(max_context=None):
            count = capture(max_context)
            engine.captured = set(engine.graphs.keys)
            return count

        engine.capture_graphs = recorded
        engines.append(engine)
        return engine

    monkeypatch.setattr(build, "build_engine", with_graphs)
    result = _invoke("--target", str(tiny_llama), "--methods", "vanilla,dflash,adaflash", "--draft-dir", str(drafts),
                     "--prompts", str(prompt_file), "--num-prompts", "3", "--max-new-tokens", "12", "--device", "cpu",
                     "--batch-sizes", "2", "--warmup", "full", "--format", "json")
    assert result.exit_code == 0, result.output
    assert "adaflash @ batch 2: captured " in result.stderr  # said, with the count and the time
    measured = [engine for engine in engines if engine.graphs.keys]
    assert {engine.method for engine in measured} == {"vanilla", "dflash", "adaflash"}
    for engine in measured:
        assert engine.captured, engine.method  # captured before any generate: the set was taken then
        assert engine.graphs.keys == engine.captured, engine.graphs.keys - engine.captured


def test_interleaved_order_takes_turns_and_measures_the_same_tokens(workspace, tiny_llama, drafts, prompt_file,
                                                                    monkeypatch):
    """--order interleaved: every engine has every prompt queued and the methods take turns of a few steps
    (rotating who goes first), each timed on its own clock; every prompt is measured once per method, in
    prompt order, and greedy output matches sequential order."""
    from adaflash.bench import engine_bench
    from adaflash.bench.engine_bench import EngineBench
    from adaflash.runlog import RunLog

    turns: list[str] = []
    real = EngineBench._turn

    def spy(self, engine, clock, done, gaps):
        if engine.has_work():
            turns.append(engine.method)
        return real(self, engine, clock, done, gaps)

    monkeypatch.setattr(EngineBench, "_turn", spy)
    monkeypatch.setattr(engine_bench, "TURN_STEPS", 2)
    common = ("--target", str(tiny_llama), "--methods", "vanilla,dflash", "--draft-dir", str(drafts),
              "--prompts", str(prompt_file), "--num-prompts", "3", "--batch-sizes", "2", "--max-new-tokens", "5",
              "--device", "cpu", "--format", "json")
    result = _invoke(*common, "--order", "interleaved")
    assert result.exit_code == 0, result.output
    assert turns[:4] == ["vanilla", "dflash", "dflash", "vanilla"]  # who goes first rotates
    assert turns.count("vanilla") >= 3 and turns.count("dflash") >= 2  # 3 prompts x 5 tokens at batch 2
    inter = json.loads(result.stdout)
    assert all(r["order"] == "interleaved" and r["completed"] == 3 for r in inter["records"])
    assert all(r["accuracy"] is None for r in inter["records"])  # these prompts carry no reference answer
    assert all(0 < r["median_ttft_ms"] <= r["median_e2e_latency_ms"] < r["duration"] * 1000 for r in inter["records"])
    assert all(0 < r["median_itl_ms"] <= r["p99_itl_ms"] < r["duration"] * 1000 for r in inter["records"])
    log = RunLog.open(workspace)
    assert log.get_run(inter["run_id"])["config"]["order"] == "interleaved"
    done = [m["step"] for m in log.metrics_since(0, run_id=inter["run_id"]) if m["name"] == "prompts_done"]
    assert done == sorted(done) and done[-1] == 3  # progress: prompts every method has answered
    turns.clear()
    result = _invoke(*common, "--order", "sequential")
    assert result.exit_code == 0, result.output
    assert turns == []
    seq = json.loads(result.stdout)
    tokens = {r["method"]: r["total_output_tokens"] for r in seq["records"]}
    assert {r["method"]: r["total_output_tokens"] for r in inter["records"]} == tokens
    assert all(r["identical"] in (None, True) for r in inter["records"] + seq["records"])
    assert all(r["median_itl_ms"] > 0 for r in seq["records"])


def test_token_gaps_spread_a_steps_gap_over_the_tokens_it_brought():
    from adaflash.bench.metrics import TokenGaps
    from adaflash.engine.engine import StepEvent

    now = [0.0]
    gaps = TokenGaps(lambda: now[0])
    for at, rid, ids in ((1.0, "a", [5]), (1.0, "b", [6]), (1.3, "a", [7, 8, 9]), (1.5, "b", []), (1.6, "b", [4])):
        now[0] = at
        gaps(StepEvent(rid, ids))
    # a: first token at 1.0 (TTFT, no gap), then 3 tokens 0.3 s later; b: nothing new at 1.5, one token at 1.6
    assert gaps.itl == {"a": pytest.approx([0.1, 0.1, 0.1]), "b": pytest.approx([0.6])}


def test_turn_clock_stands_still_between_turns(monkeypatch):
    from adaflash.bench import engine_bench

    now = [10.0]
    monkeypatch.setattr(engine_bench.time, "perf_counter", lambda: now[0])
    clock = engine_bench.TurnClock()
    clock.start()
    now[0] = 12.0
    assert clock() == 2.0
    clock.stop()
    now[0] = 50.0  # other engines' turns
    assert clock() == 2.0
    clock.start()
    now[0] = 51.5
    clock.stop()
    assert clock.total == 3.5


def test_accuracy_is_scored_against_the_reference_answers(workspace, tiny_llama, tmp_path):
    """GSM8K-style references: the tiny model answers none right, and the column says 0%, not N/A."""
    rows = [{"id": "a", "prompt": "What is 2 + 3?", "reference": "5"},
            {"id": "b", "prompt": "What is 4 + 4?", "reference": "#### 8"}]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _invoke("--target", str(tiny_llama), "--prompts", str(path), "--num-prompts", "2", "--max-new-tokens", "3",
                     "--device", "cpu", "--format", "json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)["records"][0]
    assert record["accuracy"] == 0.0



def test_admit_batch_reaches_the_engine_and_the_run_config(workspace, tiny_llama, tmp_path):
    """--admit-batch 4 at batch 4: prompts are admitted only once all four slots are free, so 8 prompts
    take exactly two prefills; more than the smallest batch size is refused, naming the option."""
    from adaflash.runlog import RunLog

    prompts = tmp_path / "eight.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Count to {i + 2}."}) + "\n" for i in range(8)))
    result = _invoke("--target", str(tiny_llama), "--methods", "vanilla", "--prompts", str(prompts), "--num-prompts", "8",
                     "--batch-sizes", "4", "--admit-batch", "4", "--max-new-tokens", "5", "--device", "cpu",
                     "--warmup", "none", "--format", "json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    prefill = payload["records"][0]["passes"]["prefill"]
    assert prefill["steps"] == 2 and prefill["rows"] == 8  # four prompts a prefill
    assert RunLog.open(workspace).get_run(payload["run_id"])["config"]["engine_config"]["admit_batch"] == 4
    bad = _invoke("--target", str(tiny_llama), "--prompts", str(prompts), "--batch-sizes", "1,8", "--admit-batch", "2")
    assert bad.exit_code == 2 and "--admit-batch 2: more than the smallest --batch-sizes (1)" in bad.output


def test_no_overlap_reaches_the_engine_and_the_run_config(workspace, tiny_llama, tmp_path, monkeypatch):
    from adaflash.engine import build
    from adaflash.runlog import RunLog

    made = []  # the overlap each engine was asked for (None: the engine's default, on a GPU only)
    real = build.Engine

    def spy(*args, **kw):
        made.append(kw["config"].overlap)
        return real(*args, **kw)

    monkeypatch.setattr(build, "Engine", spy)
    prompts = tmp_path / "two.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Count to {i + 2}."}) + "\n" for i in range(2)))
    for flags, asked in ((["--no-overlap"], False), (["--overlap"], True), ([], None)):
        made.clear()
        result = _invoke("--target", str(tiny_llama), "--methods", "vanilla", "--prompts", str(prompts), "--num-prompts",
                         "2", "--max-new-tokens", "3", "--device", "cpu", "--warmup", "none", *flags, "--format", "json")
        assert result.exit_code == 0, result.output
        assert made and set(made) == {asked}
        config = RunLog.open(workspace).get_run(json.loads(result.stdout)["run_id"])["config"]
        assert config["engine_config"]["overlap"] is asked


@pytest.mark.parametrize("order", ["interleaved", "sequential"])
def test_passes_by_kind_account_for_every_step(workspace, tiny_llama, drafts, prompt_file, order):
    """Each row says where its time went: prefills, and decode steps by kind (AdaFlash's cost rule first
    times each width, "probe"); at batch 1 every prompt is one prefill and the kinds add up to the steps τ
    counts, inside the measured time."""
    result = _invoke("--target", str(tiny_llama), "--methods", "vanilla,dflash,adaflash", "--draft-dir", str(drafts),
                     "--prompts", str(prompt_file), "--num-prompts", "2", "--batch-sizes", "1", "--max-new-tokens", "6",
                     "--device", "cpu", "--warmup", "none", "--order", order, "--format", "json")
    assert result.exit_code == 0, result.output
    records = {r["method"]: r for r in json.loads(result.stdout)["records"]}
    assert set(records["vanilla"]["passes"]) == {"prefill", "decode"}
    assert set(records["dflash"]["passes"]) == {"prefill", "whole"}
    assert {"prefill", "probe"} <= set(records["adaflash"]["passes"]) <= {"prefill", "probe", "choose", "whole"}
    for method, record in records.items():
        passes = record["passes"]
        assert passes["prefill"]["steps"] == 2, method
        assert all(p["rows"] == p["steps"] for p in passes.values()), method  # batch 1: one row a pass
        steps = sum(p["steps"] for p in passes.values())
        assert steps == pytest.approx(record["total_output_tokens"] / record["accept_length"]), method
        assert 0 < sum(p["seconds"] for p in passes.values()) <= record["duration"], method
    # and the command says where each speculative row's speed-up went, from those passes
    lines = [line.strip() for line in result.stderr.splitlines() if " a step costs " in line]
    assert [line.split(":")[0] for line in lines] == ["dflash@b1", "adaflash@b1"]


def test_rows_that_differ_from_vanilla_are_explained_by_what_their_records_show():
    from adaflash.bench.engine_table import mismatch_notes

    def row(method, backend, dtype, kernels, mismatches, batch=1):
        return {"method": method, "backend": backend, "dtype": dtype, "kernels": kernels, "mismatches": mismatches,
                "concurrency": batch}

    notes = mismatch_notes([
        row("vanilla", "embedded", "bfloat16", "eager", None),
        row("dflash", "embedded", "bfloat16", "eager", 3),
        row("adaflash", "embedded", "bfloat16", "eager", 0),
        row("hf-generate", "transformers", "bfloat16", None, 5),
        row("osd", "embedded", "bfloat16", "triton 3.9.0", 1, batch=8),
        row("eagle3", "embedded", "float32", "eager", 2),
    ])
    assert len(notes) == 3
    assert notes[0].startswith("greedy output differs from Vanilla for dflash@b1: bfloat16 without the batch-invariant")
    assert notes[1] == "greedy output differs from Vanilla for hf-generate@b1: transformers rounds its own way in bfloat16"
    # with the invariant kernels on, or in float32, a difference is a real loss: no excuse offered
    assert notes[2] == "greedy output differs from Vanilla for osd@b8, eagle3@b1 (see `identical`)"
    assert mismatch_notes([row("dflash", "embedded", "bfloat16", "eager", 0)]) == []


def test_the_speedup_breakdown_splits_steps_prefills_and_host_time():
    from adaflash.bench.engine_table import speedup_breakdown

    def row(method, passes, tokens, throughput, duration, backend="embedded", batch=32):
        return {"method": method, "concurrency": batch, "backend": backend, "total_output_tokens": tokens,
                "output_throughput": throughput, "duration": duration,
                "passes": {kind: {"steps": n, "seconds": s} for kind, (n, s) in passes.items()}}

    vanilla = row("vanilla", {"decode": (1000, 2.0), "prefill": (10, 0.5)}, 4000, 1600.0, 2.5 + 0.5)
    ada = row("adaflash", {"whole": (400, 0.96), "choose": (100, 0.24), "prefill": (10, 0.5)}, 4000, 2400.0, 1.7 + 0.2)
    hf = row("hf-generate", {"decode": (1, 1.0)}, 4000, 800.0, 5.0, backend="transformers")
    other_batch = row("dflash", {"whole": (10, 0.1)}, 40, 400.0, 0.1, batch=1)  # no Vanilla at batch 1: no line
    (line,) = speedup_breakdown([vanilla, ada, hf, other_batch])
    # a step: 1.2 s / 500 = 2.4 ms against 2.0 s / 1000 = 2.0 ms; steps alone 2.0 / 1.2; with prefills 2.5 / 1.7
    assert line == ("adaflash@b32: a step costs 1.200 of Vanilla's; steps alone 1.67x, with prefills 1.47x, "
                    "measured 1.50x (host time outside the passes 0.20 s against Vanilla's 0.50 s)")
    assert speedup_breakdown([ada]) == []  # nothing to compare with


def test_tau_times_throughput_against_the_dflash_row_of_the_same_batch():
    from adaflash.bench.engine_table import against_dflash

    def row(method, tau, throughput, batch=1, backend="embedded"):
        return {"method": method, "concurrency": batch, "accept_length": tau, "output_throughput": throughput,
                "backend": backend}

    rows = [row("vanilla", 1.0, 600.0), row("dflash", 2.0, 1100.0), row("adaflash", 2.2, 1210.0),
            row("osd", 2.1, 1155.0, batch=32), row("hf-prompt-lookup", 1.3, 30.0, backend="transformers")]
    assert against_dflash(rows) == ["adaflash@b1: 1.210x (τ 2.20 against 2.00, throughput 1.100x)"]


def test_profile_writes_each_cells_kernels_after_its_measured_run(workspace, tiny_llama, drafts, prompt_file, tmp_path,
                                                                  monkeypatch):
    """--profile DIR: every (method, batch) cell's engine, after its measured run, records --profile-steps steps
    with torch.profiler: a table of its ops by their own time and a Chrome trace, named by run, method and
    batch, and the same for its first step, the prefill; the measured rows are the same as without it. Too
    few tokens left to profile is a named error."""
    import time

    from adaflash.bench import profiling

    clocks, real = [], profiling.profile_engine

    def spy(engine, *args, **kw):  # interleaved turns ran on turn clocks, which stand still after the run
        clocks.append(engine.clock is time.perf_counter)
        return real(engine, *args, **kw)

    monkeypatch.setattr(profiling, "profile_engine", spy)
    out = tmp_path / "prof"
    args = ("--target", str(tiny_llama), "--methods", "vanilla,dflash", "--draft-dir", str(drafts), "--prompts",
            str(prompt_file), "--num-prompts", "2", "--batch-sizes", "2", "--device", "cpu", "--warmup", "none",
            "--format", "json")
    result = _invoke(*args, "--max-new-tokens", "12", "--profile", str(out), "--profile-steps", "3")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    run_id, records = payload["run_id"], payload["records"]
    assert [r["method"] for r in records] == ["vanilla", "dflash"] and records[1]["identical"]
    for method in ("vanilla", "dflash"):
        table = (out / f"{run_id}-{method}-b2.top.txt").read_text()
        assert table.startswith(f"{run_id}-{method}-b2: 3 engine steps after 3 warm-up steps")
        assert "aten::" in table and "Self CPU" in table
        trace = json.loads((out / f"{run_id}-{method}-b2.trace.json").read_text())
        assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
        assert f"{method} @ batch 2: profiled 3 steps -> {out / f'{run_id}-{method}-b2.top.txt'}" in result.stderr
        # the first step, the admission of both prompts, on its own: a prefill's ops
        prefill = (out / f"{run_id}-{method}-b2-prefill.top.txt").read_text()
        assert prefill.startswith(f"{run_id}-{method}-b2: the first engine step, the prefill of 2 prompts")
        assert "aten::" in prefill
        assert f"the prefill of 2 prompts -> {out / f'{run_id}-{method}-b2-prefill.top.txt'}" in result.stderr
    assert clocks == [True, True]
    short = _invoke(*args, "--max-new-tokens", "2", "--profile", str(out), "--profile-steps", "4")
    assert short.exit_code == 2 and f"--profile {out}: " in short.output and "nothing left to profile" in short.output


def test_a_suite_is_measured_per_domain_with_an_overall_row_of_means(workspace, tiny_llama, drafts, tmp_path,
                                                                    monkeypatch):
    """Rows with a `domain` are measured domain by domain (N prompts each) on engines built once for
    every domain; the overall row's speed-up, τ and tok/s are the means of the domains' own, and
    `runs compare` shows every row."""
    from statistics import fmean

    from adaflash.cli.main import cli
    from adaflash.engine import build

    built = []
    real_build = build.build_engine

    def counting(target, method, *args, **kw):
        built.append((method, kw["config"].max_batch))
        return real_build(target, method, *args, **kw)

    monkeypatch.setattr(build, "build_engine", counting)

    rows = [{"id": f"{d}{i}", "domain": d, "prompt": f"{d} question {i}?"} for d in ("math", "code") for i in range(3)]
    suite = tmp_path / "mini_test.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _invoke("--target", str(tiny_llama), "--methods", "vanilla,dflash", "--draft-dir", str(drafts),
                     "--prompts", str(suite), "--num-prompts", "2", "--batch-sizes", "2", "--max-new-tokens", "5",
                     "--device", "cpu", "--format", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    records = out["records"]
    by = {(r["method"], r["dataset"]): r for r in records}
    assert set(by) == {(m, d) for m in ("vanilla", "dflash") for d in ("mini/math", "mini/code", "mini")}
    for domain in ("math", "code"):
        cell = by[("dflash", f"mini/{domain}")]
        assert cell["domain"] == domain and cell["num_prompts"] == 2 and cell["identical"] is True
    overall = by[("dflash", "mini")]
    ratios = [by[("dflash", f"mini/{d}")]["output_throughput"] / by[("vanilla", f"mini/{d}")]["output_throughput"]
              for d in ("math", "code")]
    assert overall["speedup"] == pytest.approx(fmean(ratios))
    assert overall["accept_length"] == pytest.approx(fmean(by[("dflash", f"mini/{d}")]["accept_length"]
                                                           for d in ("math", "code")))
    assert overall["domains"] == ["math", "code"] and overall["identical"] is True
    assert sorted(b for b in built if b[1] == 2) == [("dflash", 2), ("vanilla", 2)]  # not once per domain
    compared = CliRunner().invoke(cli, ["runs", "compare", out["run_id"], "--format", "json"])
    assert compared.exit_code == 0, compared.output
    table = json.loads(compared.stdout)["rows"]
    speedups = {(r["method"], r["dataset"]): r["speedup"] for r in table}
    assert speedups[("dflash", "mini")] == pytest.approx(fmean(ratios))
    assert speedups[("dflash", "mini/code")] == pytest.approx(ratios[1])
    assert speedups[("vanilla", "mini")] == pytest.approx(1.0)


def test_acceptance_by_position_counts_the_steps_that_reached_each_drafted_position():
    from adaflash.bench.metrics import RequestResult, accept_by_position
    from adaflash.engine.params import Request, SamplingParams
    from adaflash.engine.sequence import RunningSeq

    seq = RunningSeq(Request([1, 2], SamplingParams(max_new_tokens=50)), slot=0, arrived=0.0)
    for accepted, proposed in ((2, 4), (0, 4), (4, 4), (1, 2)):  # the last: a length head verified 2 of 4
        seq.take([5] * (accepted + 1), accepted=accepted, proposed=proposed, eos_ids=[], decode=str)
    assert seq.by_position == [[4, 3], [3, 2], [2, 1], [1, 1]]
    other = RequestResult("b", by_position=[[2, 0]])
    assert accept_by_position([RequestResult("a", by_position=seq.by_position), other]) == pytest.approx([0.5, 2 / 3, 0.5, 1.0])
    assert accept_by_position([RequestResult("v")]) is None



def test_scripted_acceptance_sets_tau_and_keeps_vanillas_tokens(workspace, tiny_llama, drafts, prompt_file):
    """A benchmark mode for targets no drafter can guess: with shares 1, 1, 0 every full step accepts
    exactly two drafts, with 0, 0, 0 none, and the outputs stay Vanilla's; the records say τ was scripted."""
    base = ["--target", str(tiny_llama), "--methods", "vanilla,dflash,adaflash", "--draft-dir", str(drafts),
            "--prompts", str(prompt_file), "--num-prompts", "2", "--batch-sizes", "2", "--max-new-tokens", "31",
            "--device", "cpu", "--dtype", "float32", "--format", "json"]
    for shares, tau in (("1,1,0", 31 / 11), ("0,0,0", 1.0)):  # 31 tokens: the prefill's, then 10 steps of 3 (or 30 of 1)
        result = _invoke(*base, "--acceptance", shares)
        assert result.exit_code == 0, result.output
        cells = {r["method"]: r for r in json.loads(result.stdout)["records"]}
        dflash = cells["dflash"]
        assert dflash["identical"] is True and cells["adaflash"]["identical"] is True
        assert dflash["accept_length"] == pytest.approx(tau)
        assert dflash["acceptance_script"] == [float(s) for s in shares.split(",")]
        assert cells["vanilla"]["acceptance_script"] is None
        if shares == "1,1,0":
            assert dflash["accept_by_position"][:3] == [1.0, 1.0, 0.0]
        # AdaFlash's cost rule shows the step times it chose from, one per verify width (min-length 2 to 4)
        costs = re.search(r"adaflash@b2: ms a step by verify width at batch 2 \(cost rule\): (.*)", result.output)
        assert costs is not None, result.output
        assert [int(part.split(":")[0]) for part in costs.group(1).split(", ")] == [2, 3, 4]
    result = _invoke(*base, "--acceptance", "1,1")
    assert result.exit_code == 2 and "give one per drafted position" in result.output


def test_length_spread_gives_each_prompt_its_own_budget_in_every_method(workspace, tiny_llama, drafts, tmp_path):
    """--length-spread 0.75 with 24 new tokens: each prompt's budget is drawn from [6, 24] by its id, the same for
    every method and batch size, so the answers of this random target end at different steps; every row stays
    Vanilla's; with --compare-hf the command refuses, naming both options."""
    from adaflash.bench.prompts import answer_budget

    rows = [{"id": f"p{i}", "prompt": f"Tell me about the number {i}."} for i in range(6)]
    prompts = tmp_path / "six.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _invoke("--target", str(tiny_llama), "--methods", "vanilla,dflash", "--draft-dir", str(drafts),
                     "--prompts", str(prompts), "--num-prompts", "6", "--batch-sizes", "1,3", "--max-new-tokens", "24",
                     "--length-spread", "0.75", "--device", "cpu", "--warmup", "none", "--format", "json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)["records"]
    budgets = [answer_budget(r["id"], 24, 0.75) for r in rows]
    assert all(6 <= b <= 24 for b in budgets) and len(set(budgets)) >= 3
    for record in records:
        assert record["length_spread"] == 0.75 and record["identical"] is not False, record["method"]
        assert record["total_output_tokens"] == sum(budgets), record["method"]  # each answer its own budget
    refused = _invoke("--target", str(tiny_llama), "--prompts", str(prompts), "--length-spread", "0.5", "--compare-hf",
                      "--device", "cpu")
    assert refused.exit_code != 0 and "--compare-hf" in refused.output and "--length-spread" in refused.output
    bad = _invoke("--target", str(tiny_llama), "--prompts", str(prompts), "--length-spread", "1.5", "--device", "cpu")
    assert bad.exit_code != 0 and "--length-spread" in bad.output


def test_answer_budget_is_the_prompts_own_and_spans_the_range():
    from adaflash.bench.prompts import answer_budget

    budgets = [answer_budget(f"q{i}", 100, 0.5) for i in range(400)]
    assert min(budgets) >= 50 and max(budgets) <= 100 and len(set(budgets)) > 40
    assert budgets == [answer_budget(f"q{i}", 100, 0.5) for i in range(400)]  # by id: the same every time
    assert answer_budget("q1", 100, 0.0) == 100 and answer_budget("q1", 1, 1.0) == 1
