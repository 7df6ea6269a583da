"""`adaflash bench cost`: the verify-cost curve through the engine's own passes, recorded in the run log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from adaflash.bench.cost import CostBench, CostBenchError, CostSpec, bandwidth_of, parse_sizes, weight_bytes
from adaflash.cli.main import cli
from adaflash.runlog import RunLog


@pytest.fixture(scope="module")
def synth_target(tmp_path_factory) -> Path:
    from adaflash.models.synth import write_synth

    return write_synth("qwen3-tiny", tmp_path_factory.mktemp("cost") / "qwen3-tiny", seed=1).out


def test_cost_cli_times_every_cell_and_records_it(synth_target, workspace, tmp_path):
    plot = tmp_path / "curve.png"
    argv = ["bench", "cost", "--target", str(synth_target), "--batch-sizes", "3,1", "--widths", "1,2,4",
            "--context", "24", "--repeats", "3", "--warmup", "1", "--dtype", "float32",
            "--bandwidth-gbs", "50", "--out", str(plot), "--json"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    cells = {(c["batch"], c["width"]): c for c in data["cells"]}
    assert sorted(cells) == [(b, k) for b in (1, 3) for k in (1, 2, 4)]
    assert all(0 < c["ms_min"] <= c["ms"] <= c["ms_max"] and c["repeats"] == 3 for c in cells.values())
    assert all(cells[(b, 1)]["ratio"] == 1.0 for b in (1, 3))
    assert cells[(3, 4)]["ratio"] == pytest.approx(cells[(3, 4)]["ms"] / cells[(3, 1)]["ms"])
    assert (data["hardware"], data["dtype"], data["cuda_graphs"]) == ("cpu", "float32", False)
    assert data["context"] == 24
    roofline = {row["batch"]: row for row in data["roofline"]}
    kv = data["kv_bytes_per_token"]
    assert kv == 4 * 2 * 2 * 32 * 4  # layers × (k, v) × kv heads × head_dim × float32
    assert roofline[3]["bytes_read"] == data["weight_bytes"] + kv * 24 * 3
    assert roofline[3]["floor_ms"] == pytest.approx(roofline[3]["bytes_read"] / 50e9 * 1e3)
    assert 0 < roofline[1]["share"] == pytest.approx(roofline[1]["floor_ms"] / cells[(1, 1)]["ms"])
    assert plot.stat().st_size > 0 and data["plot"] == str(plot)

    log = RunLog.open(workspace)
    run = log.get_run(data["run_id"])
    assert (run["kind"], run["name"], run["status"]) == ("bench", "bench-cost", "finished")
    assert run["target"] == str(synth_target) and "k4/k1" in run["note"]
    assert run["config"]["widths"] == [1, 2, 4] and run["config"]["batch_sizes"] == [1, 3]
    assert len(run["config"]["result"]["cells"]) == 6
    metrics = log.last_metrics(data["run_id"])
    assert metrics["pass_ms_b3_k4"] == pytest.approx(cells[(3, 4)]["ms"])
    assert metrics["pass_ratio_b1_k1"] == 1.0 and "roofline_share_b3" in metrics


def test_padded_shapes_time_the_bucketed_batch(synth_target):
    """As on a GPU: batch 3 runs as the padded batch of 4 (the engine's bucket), slots 0..3 in order."""
    spec = CostSpec(target=str(synth_target), batch_sizes=[3, 4], widths=[1, 3], context=20, dtype="float32",
                    repeats=2, warmup=1)
    bench = CostBench(spec, pad_shapes=True)
    result = bench.run()
    assert bench.passes.padded and bench.passes.rows_for([0, 1, 2], fill=True) == ([0, 1, 2, 3], True)
    assert [(c["batch"], c["width"]) for c in result.cells] == [(3, 1), (3, 3), (4, 1), (4, 3)]
    assert result.bandwidth_gbs is None and result.roofline()[0]["share"] is None


def test_table_output_and_clear_errors(synth_target, workspace):
    runner = CliRunner()
    result = runner.invoke(cli, ["bench", "cost", "--target", str(synth_target), "--batch-sizes", "2",
                                 "--widths", "1,2", "--context", "8", "--repeats", "1", "--warmup", "0",
                                 "--dtype", "float32", "--format", "markdown"])
    assert result.exit_code == 0, result.output
    assert "| batch | k=1 | k=2 |" in result.stdout and "1.00x" in result.stdout
    cases = [(["--widths", "1,x"], "--widths must be comma-separated integers"),
             (["--batch-sizes", "0,8"], "--batch-sizes values must be ≥ 1"),
             (["--widths", ","], "--widths is empty"),
             (["--out", "curve.pdf"], "--out curve.pdf: the plot is written as .png or .svg"),
             (["--context", "5000"], "more than the target's 4096 positions")]
    for argv, message in cases:
        result = runner.invoke(cli, ["bench", "cost", "--target", str(synth_target), "--dtype", "float32",
                                     "--batch-sizes", "1", "--widths", "1", *argv])
        assert result.exit_code == 2 and message in result.output, (argv, result.output)
    runs = RunLog.open(workspace).list_runs(kind="bench")
    assert [r["status"] for r in runs] == ["finished"]  # a refused setting records no run


def test_parse_sizes_bandwidths_and_weight_bytes(synth_target):
    assert parse_sizes("16, 1,4,4", "--widths", "1,2") == [1, 4, 16]
    with pytest.raises(CostBenchError, match="--batch-sizes"):
        parse_sizes("1,-2", "--batch-sizes", "1,8")
    assert bandwidth_of("NVIDIA H200") == 4800 and bandwidth_of("NVIDIA H100 80GB HBM3") == 3350
    assert bandwidth_of("NVIDIA H100 PCIe") == 2000 and bandwidth_of("NVIDIA A10G") is None
    from adaflash.models.target import load_target_model

    model = load_target_model(synth_target)
    everything = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.model.embed_tokens.weight
    assert weight_bytes(model) == everything - embed.numel() * embed.element_size()  # untied: a row per token


def _curve(ms_by_batch: dict[int, list[float]], widths: list[int]):
    from adaflash.bench.cost import CostResult

    spec = CostSpec(target="t", batch_sizes=list(ms_by_batch), widths=widths)
    cells = [{"batch": b, "width": w, "ms": ms, "ratio": ms / times[0]} for b, times in ms_by_batch.items()
             for w, ms in zip(widths, times)]
    return CostResult(spec, "cpu", "float32", False, "eager", 64, 1, 1, None, cells)


def test_the_best_width_is_the_whole_block_where_verifying_is_free_and_shorter_where_it_costs():
    from adaflash.bench.width_gain import expected_tokens, pass_ms, width_gains

    assert expected_tokens([0.5, 0.5, 0.5], 2) == 1.75 and expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    curve = _curve({1: [10.0, 10.0, 10.0], 64: [10.0, 12.0, 40.0]}, [1, 2, 4])
    assert pass_ms(curve, 64, 3) == 26.0  # between the measured 2 and 4
    flat, steep = width_gains(curve, [0.5, 0.5, 0.5])
    assert (flat["best_width"], flat["gain"], flat["block"]) == (4, 1.0, 4)
    # steep: whole block 1.875 tokens / 40 ms; one draft 1.5 / 12 ms, the best
    assert steep["best_width"] == 2 and steep["gain"] == pytest.approx((1.5 / 12) / (1.875 / 40))


def test_cost_cli_says_what_a_shorter_width_would_gain(synth_target, workspace):
    base = ["bench", "cost", "--target", str(synth_target), "--batch-sizes", "1,2", "--widths", "1,2,4",
            "--context", "16", "--repeats", "2", "--warmup", "1", "--dtype", "float32"]
    result = CliRunner().invoke(cli, [*base, "--acceptance", "0.6,0.5,0.4", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    gains = {row["batch"]: row for row in data["width_gains"]}
    assert set(gains) == {1, 2} and all(row["gain"] >= 1.0 and 1 <= row["best_width"] <= 4 for row in gains.values())
    assert gains[1]["whole_tokens"] == pytest.approx(1 + 0.6 + 0.3 + 0.12)
    metrics = {m["name"] for m in RunLog.open(workspace).metrics_since(0, run_id=data["run_id"])}
    assert {"width_gain_b1", "best_width_b2"} <= metrics
    result = CliRunner().invoke(cli, [*base, "--acceptance", "0.6,0.5,0.4,0.3"])
    assert result.exit_code == 2 and "--widths must reach it" in result.output
    result = CliRunner().invoke(cli, [*base, "--acceptance", "0.6,high"])
    assert result.exit_code == 2 and "--acceptance must be comma-separated numbers" in result.output
