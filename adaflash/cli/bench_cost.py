"""`adaflash bench cost`: the verify-cost curve (ms per target pass of k tokens at batch b)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from adaflash.bench.cost import gigabytes
from adaflash.cli.common import emit_rows, fail, runlog_of
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.resolve import out_file, warmup_count
from adaflash.options import BenchConfig, JobConfig, ModelConfig, SamplingConfig


@click.command("cost")
@uses(use(ModelConfig, only=("target", "device", "dtype")), use(BenchConfig, only=("batch_sizes", "widths", "acceptance", "context", "repeats", "warmup",
                                                                                 "bandwidth_gbs", "label")),
      use(SamplingConfig, only=("seed",), notes={"seed": "Here: of the random token ids."}),
      use(JobConfig, only=("out",)), Output(("table", "markdown", "csv", "json")), command="bench cost")
@click.pass_context
def cost(ctx: click.Context, model: ModelConfig, bench: BenchConfig, sampling: SamplingConfig, job: JobConfig,
         output: str) -> None:
    """Time one target pass of k tokens at batch b, and its ratio to the k=1 pass at the same batch.

    Each pass is the engine's own verify pass over rows holding --context tokens (on a GPU replayed from its
    CUDA graph, on a CPU eager), timed from launch to its last kernel: the median of --repeats. This is the
    verify-cost curve that decides where verifying fewer drafted tokens pays. With a known bandwidth, the
    k=1 pass is also set against the floor of a Vanilla decode step: the bytes of the weights and of every
    row's cache, read once. The table goes to the run log (`adaflash runs show RUN`). --out also plots it.
    """
    from adaflash.bench.cost import CostBench, CostBenchError, CostSpec, parse_sizes, record
    from adaflash.bench.width_gain import parse_acceptance

    plot = out_file(ctx, job.out) if job.out else None
    if plot and Path(plot).suffix.lower() not in (".png", ".svg"):
        fail(f"--out {plot}: the plot is written as .png or .svg")
    widths, context, repeats, bandwidth_gbs = bench.widths, bench.context, bench.repeats, bench.bandwidth_gbs
    try:
        spec = CostSpec(target=model.target or "", batch_sizes=parse_sizes(bench.batch_sizes, "--batch-sizes", "1,8,32,64"),
                        widths=parse_sizes(widths, "--widths", "1,2,4,8,16"), context=context, device=model.device,
                        dtype=model.dtype, repeats=repeats, warmup=warmup_count(bench), bandwidth_gbs=bandwidth_gbs,
                        seed=sampling.seed or 0, label=bench.label)
        acceptance = parse_acceptance(bench.acceptance) if bench.acceptance else None
        if acceptance and len(acceptance) + 1 > max(spec.widths):
            raise CostBenchError(f"--acceptance: {len(acceptance)} drafts make a block of {len(acceptance) + 1} "
                                 f"tokens; --widths must reach it (now up to {max(spec.widths)})")
        log = runlog_of(ctx)
        run_id, result = record(log, CostBench(spec, _say), _on_cell)
        gains = _gains(log, run_id, result, acceptance) if acceptance else None
    except CostBenchError as err:
        fail(str(err))
    _report(run_id, result, output, plot, gains)


def _gains(log: Any, run_id: str, result: Any, acceptance: list[float]) -> list[dict[str, Any]]:
    """The width gains, recorded beside the table as `width_gain_b{B}` and `best_width_b{B}`."""
    from adaflash.bench.width_gain import width_gains

    rows = width_gains(result, acceptance)
    log.log_metrics(run_id, {f"{name}_b{row['batch']}": row[key] for row in rows
                             for name, key in (("width_gain", "gain"), ("best_width", "best_width"))})
    return rows


def _say(message: str) -> None:
    click.echo(message, err=True)


def _on_cell(cell: dict[str, Any]) -> None:
    _say(f"b {cell['batch']:>3} k {cell['width']:>2}: {cell['ms']:.3f} ms (min {cell['ms_min']:.3f})")


def _report(run_id: str, result: Any, output: str, plot: str | None, gains: list[dict[str, Any]] | None) -> None:
    picture = None
    if plot:
        from adaflash.bench.cost_plot import plot_cost

        picture = plot_cost(result, plot)
    data = {"run_id": run_id, **result.as_json(), "plot": str(picture) if picture else None, "width_gains": gains}
    if output == "json":
        click.echo(json.dumps(data, indent=2, default=str))
    elif output == "csv":
        emit_rows(result.cells, ["batch", "width", "ms", "ms_min", "ms_max", "ratio"], "csv")
    else:
        _print_tables(result, output, run_id)
        if gains:
            if output == "markdown":
                click.echo()
            emit_rows([{**g, "whole_tokens": f"{g['whole_tokens']:.2f}", "best_tokens": f"{g['best_tokens']:.2f}",
                        "gain": f"{g['gain']:.3f}x"} for g in gains],
                      ["batch", "block", "whole_tokens", "best_width", "best_tokens", "gain"], output,
                      title="the best fixed width against the whole block, at this acceptance")
    if picture:
        _say(f"plot: {picture}")
    _say(f"recorded in the run log: adaflash runs show {run_id}")


def _print_tables(result: Any, fmt: str, run_id: str) -> None:
    """Per batch: ms per pass by k (with the roofline where a bandwidth is known), then the ratios to k=1."""
    spec = result.spec
    ks = [f"k={w}" for w in spec.widths]
    roofline = {row["batch"]: row for row in result.roofline()}
    timed, ratios = [], []
    for batch in spec.batch_sizes:
        cells = [result.cell(batch, w) for w in spec.widths]
        row: dict[str, Any] = {"batch": batch, **{k: c["ms"] for k, c in zip(ks, cells)}}
        if result.bandwidth_gbs:
            line = roofline[batch]
            row.update({"floor ms": line["floor_ms"], "share": f"{line['share']:.0%}"})
        timed.append(row)
        ratios.append({"batch": batch, **{k: f"{c['ratio']:.2f}x" for k, c in zip(ks, cells)}})
    extra = ["floor ms", "share"] if result.bandwidth_gbs else []
    click.echo(f"bench cost [{run_id}]: {spec.target} · {result.hardware} · {result.dtype} · "
               f"{'CUDA graphs' if result.cuda_graphs else 'eager'} · context {spec.context} · "
               f"median of {spec.repeats}")
    emit_rows(timed, ["batch", *ks, *extra], fmt, title="ms per target pass")
    if fmt == "markdown":
        click.echo()
    emit_rows(ratios, ["batch", *ks], fmt, title=f"ratio to k={min(spec.widths)} at the same batch")
    if result.bandwidth_gbs:
        click.echo(f"floor: {gigabytes(result.weight_bytes)} of weights + the cache of {spec.context} tokens "
                   f"a row, read once at {result.bandwidth_gbs:g} GB/s; share = floor / the "
                   f"k={min(spec.widths)} pass", err=True)
    else:
        click.echo("no roofline: give --bandwidth-gbs (known by name: H100, H200)", err=True)
