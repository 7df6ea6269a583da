"""`adaflash runs`: read the run log."""

from __future__ import annotations

import json

import click

from adaflash.cli.common import emit_rows, existing_runlog_of, fail, run_or_fail
from adaflash.cli.groups import Output, use, uses
from adaflash.options import InputConfig, ModelConfig, RunsConfig

RUN_COLUMNS = ["id", "kind", "status", "method", "target", "draft", "dataset", "created"]


def _created(row: dict) -> dict:
    import datetime

    row = dict(row)
    row["created"] = datetime.datetime.fromtimestamp(row["created_at"]).strftime("%Y-%m-%d %H:%M:%S")
    return row


@click.group()
def runs() -> None:
    """Read the run log: list, show, compare, export runs."""


@runs.command("list")
@uses(use(RunsConfig, only=("kind", "status")), use(ModelConfig, only=("method", "target")),
      use(InputConfig, only=("dataset", "limit")), Output(("table", "json", "csv")), command="runs list")
@click.pass_context
def list_runs(ctx: click.Context, runs: RunsConfig, model: ModelConfig, inputs: InputConfig, output: str) -> None:
    """Runs in the workspace, newest first (--method, --target, --dataset: only runs of these)."""
    if len(model.method) > 1:
        fail("--method filters by one method here")
    log = existing_runlog_of(ctx)
    rows = log.list_runs(kind=runs.kind, status=runs.status, method=model.method[0] if model.method else None,
                         target=model.target, dataset=inputs.dataset, limit=inputs.limit)
    emit_rows([_created(r) for r in rows], RUN_COLUMNS, output, title="Runs")


@runs.command("show")
@click.argument("run_id")
@uses(Output(("table", "json")), command="runs show")
@click.pass_context
def show_run(ctx: click.Context, run_id: str, output: str) -> None:
    """One run: its fields, jobs, latest metrics, checkpoints, benchmark results and the runs under it."""
    log = existing_runlog_of(ctx)
    run = run_or_fail(log, run_id)
    detail = {
        "run": run,
        "jobs": log.jobs(run["id"]),
        "metrics": log.last_metrics(run["id"]),
        "checkpoints": log.checkpoints(run["id"]),
        "bench_results": [r["data"] for r in log.bench_results([run["id"]])],
        "events": log.events_since(0, run_id=run["id"])[-20:],
        "children": [{k: c.get(k) for k in ("id", "kind", "name", "status", "parent_id", "job")}
                     for c in log.child_runs(run)],
    }
    if output == "json":
        click.echo(json.dumps(detail, indent=2, default=str))
        return
    emit_rows([{"field": k, "value": v} for k, v in _created(run).items()], ["field", "value"], "table", title=f"Run {run['id']}")
    if detail["metrics"]:
        emit_rows([{"metric": k, "value": v} for k, v in sorted(detail["metrics"].items())], ["metric", "value"], "table",
                  title="Latest metrics")
    if detail["jobs"]:
        emit_rows(detail["jobs"], ["id", "name", "role", "status", "gpus", "pid", "exit_code", "restarts", "log_path"],
                  "table", title="Jobs")
    if detail["checkpoints"]:
        emit_rows(detail["checkpoints"], ["kind", "version", "step", "path"], "table", title="Checkpoints")
    if detail["children"]:
        emit_rows(detail["children"], ["id", "kind", "name", "status", "parent_id", "job"], "table",
                  title="Runs under it")
    if detail["events"]:
        emit_rows(detail["events"], ["level", "job", "message"], "table", title="Events")


from adaflash.cli.runs_bench import compare_runs, export_runs, import_runs  # noqa: E402

runs.add_command(compare_runs)
runs.add_command(export_runs)
runs.add_command(import_runs)
from adaflash.cli.runs_control import attach_run, stop_run  # noqa: E402

runs.add_command(attach_run)
runs.add_command(stop_run)
