"""`adaflash runs compare|export|import`: benchmark comparisons over the run log (logic in adaflash.bench.compare)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from adaflash.cli.common import emit_rows, existing_runlog_of, fail, runlog_of
from adaflash.engine.params import METHODS


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
    from rich.console import Console
    from rich.table import Table

    shown, titles = compare.display_rows(rows)
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
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "csv", "json"]), default="table",
              show_default=True, help="Output format.")
@click.pass_context
def compare_runs(ctx: click.Context, run_ids: tuple[str, ...], fmt: str) -> None:
    """Compare benchmark results: method × dataset × concurrency, speed-up vs Vanilla.

    RUN ids may be bench-matrix runs (all their results), bench runs or imports; with none, the
    latest bench matrix (or every result when there is no matrix).
    """
    print_comparison(existing_runlog_of(ctx), list(run_ids) or None, fmt)


@click.command("export")
@click.argument("run_ids", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["csv", "json", "jsonl", "markdown"]), default="json",
              show_default=True, help="json/jsonl/csv: the full records; markdown: the comparison table.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here instead of stdout.")
@click.pass_context
def export_runs(ctx: click.Context, run_ids: tuple[str, ...], fmt: str, output: str | None) -> None:
    """Export the benchmark results of RUN(s) (a bench matrix brings all of its results)."""
    from adaflash.bench import compare

    log = existing_runlog_of(ctx)
    try:
        records, where = compare.select_records(log, list(run_ids))
    except KeyError as err:
        fail(err.args[0])
    if not records:
        fail(f"no benchmark results in {where}")
    text = compare.export_records(records, fmt)
    if output:
        Path(output).expanduser().write_text(text)
        click.echo(f"wrote {len(records)} result(s) to {output}", err=True)
    else:
        click.echo(text, nl=False)


@click.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--method", type=click.Choice(METHODS), default=None,
              help="Method of every line [default: from server_info.speculative_algorithm].")
@click.option("--dataset", default=None, help="Dataset of every line [default: dataset_name].")
@click.option("--target", default=None, help="Target of every line [default: server_info.model_path].")
@click.option("--label", default=None, help="A label for the imported results.")
@click.pass_context
def import_runs(ctx: click.Context, path: str, method: str | None, dataset: str | None, target: str | None,
                label: str | None) -> None:
    """Import benchmark results as one run: SGLang bench_serving results (JSONL, its key names), or what
    `adaflash runs export` wrote in another workspace (json or jsonl)."""
    from adaflash.bench.compare import ImportFormatError, read_results

    try:
        records = read_results(path, method=method, dataset=dataset, target=target)
    except ImportFormatError as err:
        fail(str(err))
    log = runlog_of(ctx)
    methods = sorted({str(r["method"]) for r in records})
    run_id = log.create_run("bench", name=label or f"import-{Path(path).name}",
                            method=methods[0] if len(methods) == 1 else None,
                            target=records[0].get("target"), dataset=records[0].get("dataset"),
                            config={"imported_from": str(Path(path).resolve()), "results": len(records)})
    for record in records:
        if label:
            record["label"] = label
        log.add_bench_result(run_id, record)
    log.finish_run(run_id)
    click.echo(f"imported {len(records)} result(s) from {path} as run {run_id}")
