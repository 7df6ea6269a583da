"""`adaflash runs compare|export|import`: benchmark comparisons over the run log (logic in adaflash.bench.compare)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import emit_rows, existing_runlog_of, fail, recorded_run, runlog_of
from adaflash.cli.groups import Output, use, uses
from adaflash.options import BenchConfig, InputConfig, JobConfig, ModelConfig


def plain_table(rows: list[dict], titles: list[str]) -> str:
    """Columns padded to their widest value, two spaces apart: nothing cut, however wide (for files and pipes)."""
    cells = [titles] + [["N/A" if row[t] is None else str(row[t]) for t in titles] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(titles))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells)


def print_comparison(log, run_ids: list[str] | None, fmt: str) -> None:
    from adaflash.bench import compare

    try:
        records, where = compare.select_records(log, run_ids)
    except KeyError as err:
        fail(err.args[0])
    if not records:
        fail(f"no benchmark results in {where}; run `adaflash bench` or `adaflash bench matrix` first")
    rows, warnings = compare.comparison_rows(records)
    if fmt == "json":
        click.echo(json.dumps({"source": where, "rows": rows, "rules": compare.FAIRNESS_RULES,
                               "warnings": list(dict.fromkeys(warnings))}, indent=2, default=str))
        return
    if fmt == "csv":
        emit_rows(rows, ["group", "run_id", *compare.columns_for(rows), "fair"], "csv")
        return
    if fmt == "markdown":
        click.echo(compare.markdown_table(rows, warnings), nl=False)
        return
    shown, titles = compare.display_rows(rows)
    if not sys.stdout.isatty():  # a file or a pipe: every value whole, no terminal layout
        click.echo(f"Comparison: {where}")
        click.echo(plain_table(shown, titles))
        click.echo(compare.footer(warnings, rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Comparison: {where}")
    for title in titles:
        table.add_column(title, no_wrap=True, justify="left" if title in ("method", "target", "dataset", "label")
                         else "right")
    for item in shown:
        table.add_row(*("N/A" if item[t] is None else str(item[t]) for t in titles))
    Console(width=max(Console().width, 200)).print(table)
    click.echo(compare.footer(warnings, rows))


@click.command("compare")
@click.argument("run_ids", nargs=-1)
@uses(Output(("table", "markdown", "csv", "json")), command="runs compare")
@click.pass_context
def compare_runs(ctx: click.Context, run_ids: tuple[str, ...], output: str) -> None:
    """Compare benchmark results: method × dataset × concurrency, speed-up vs Vanilla.

    RUN ids may be bench-matrix runs (all their results), bench runs or imports; with none, the
    latest bench matrix (or every result when there is no matrix).
    """
    print_comparison(existing_runlog_of(ctx), list(run_ids) or None, output)


@click.command("export")
@click.argument("run_ids", nargs=-1, required=True)
@uses(Output(("json", "csv", "jsonl", "markdown"), help="json/jsonl/csv: the full records; markdown: the comparison "
                                                         "table."), use(JobConfig, only=("output_file",)),
      command="runs export")
@click.pass_context
def export_runs(ctx: click.Context, run_ids: tuple[str, ...], output: str, job: JobConfig) -> None:
    """Export the benchmark results of RUN(s) (a bench matrix brings all of its results)."""
    from adaflash.bench import compare

    log = existing_runlog_of(ctx)
    try:
        records, where = compare.select_records(log, list(run_ids))
    except KeyError as err:
        fail(err.args[0])
    if not records:
        fail(f"no benchmark results in {where}")
    text, output_file = compare.export_records(records, output), job.output_file
    if output_file:
        Path(output_file).expanduser().write_text(text)
        click.echo(f"wrote {len(records)} result(s) to {output_file}", err=True)
    else:
        click.echo(text, nl=False)


@click.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@uses(use(ModelConfig, only=("method", "target")), use(InputConfig, only=("dataset",)),
      use(BenchConfig, only=("concurrency", "label")), command="runs import")
@click.pass_context
def import_runs(ctx: click.Context, path: str, model: ModelConfig, inputs: InputConfig, bench: BenchConfig) -> None:
    """Import benchmark results as one run: SGLang bench_serving results (JSONL, its key names), or what
    `adaflash runs export` wrote in another workspace (json or jsonl).

    --method, --target, --dataset, --concurrency set those of every line [default: the line's own or
    server_info's method (an adaflash server reports it), else server_info.speculative_algorithm; server_info's
    target, else model_path (a built-in's cached folder is recorded by the built-in's name); dataset_name;
    max_concurrency]. A result the run log already holds (the same line, by its content) is skipped, so
    importing a file twice adds nothing the second time."""
    from adaflash.bench.compare import ImportFormatError, read_results

    if len(model.method) > 1 or len(bench.levels) > 1:
        fail("--method and --concurrency are given once here (those of every line)")
    try:
        records = read_results(path, method=model.method[0] if model.method else None, dataset=inputs.dataset,
                               target=model.target, concurrency=bench.levels[0] if bench.levels else None)
    except ImportFormatError as err:
        fail(str(err))
    _import(runlog_of(ctx), path, records, bench.label)


def _import(log: Any, path: str, records: list[dict[str, Any]], label: str | None) -> None:
    """Add the records the run log does not hold yet, as one run."""
    held = log.imported_results(r["content_hash"] for r in records)
    for run in {r.get("imported_run_id") for r in records} - {None}:  # exported from this very log
        ids = {row["id"] for row in log.bench_results([run])}
        held.update({r["content_hash"]: run for r in records
                     if r.get("imported_run_id") == run and r.get("imported_result_id") in ids})
    fresh = [r for r in records if r["content_hash"] not in held]
    if not fresh:
        runs = ", ".join(sorted(set(held.values())))
        click.echo(f"nothing imported: the run log already holds all {len(records)} result(s) of {path} "
                   f"(run {runs})")
        return
    methods = sorted({str(r["method"]) for r in fresh})
    with recorded_run(log, "bench", name=label or f"import-{Path(path).name}",
                      method=methods[0] if len(methods) == 1 else None, target=fresh[0].get("target"),
                      dataset=fresh[0].get("dataset"),
                      config={"imported_from": str(Path(path).resolve()), "results": len(fresh)}) as run:
        for record in fresh:
            if label:
                record["label"] = label
            log.add_bench_result(run.id, record)
    run_id = run.id
    skipped = f"; {len(records) - len(fresh)} already held were skipped" if len(fresh) < len(records) else ""
    click.echo(f"imported {len(fresh)} result(s) from {path} as run {run_id}{skipped}")
    unset = sum(1 for r in fresh if r.get("concurrency") is None)
    if unset:
        click.secho(f"note: {unset} result(s) have no max_concurrency, so they compare only with rows that have none "
                    "either; give --concurrency N to say what they ran at", fg="bright_black", err=True)
