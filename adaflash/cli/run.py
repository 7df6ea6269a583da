"""`adaflash run RECIPE`: plan, then run a recipe's jobs headless with live progress.

The control plane lives in `jobs` (no torch); this module wires the command and signals, and
`run_display` draws where the run stands.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from typing import Any

import click

from adaflash.cli.common import fail
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.run_display import ProgressDisplay, follow_slurm, print_event, print_final
from adaflash.options import JobConfig, RecipeConfig


@click.command("run", context_settings={"show_default": True})
@click.argument("recipe", required=False)
@uses(use(JobConfig, only=("dry_run", "workspace"), notes={"dry_run": "Here: the plan, with what the cache reuses."}),
      RecipeConfig, Output(("text", "json"), help="text, or json: the plan (and the result)."), command="run")
@click.pass_context
def run(ctx: click.Context, recipe: str | None, job: JobConfig, plan: RecipeConfig, output: str) -> None:
    """Run a recipe (TOML, or a shipped recipe's name): plan, start its jobs, supervise them.

    Jobs start as subprocesses in their own process groups, logs in <workspace>/runs/<run>/<job>.log,
    each recorded in the run log. A job that declares `outputs` is reused (status `cached`) when an
    earlier run finished it with the same command, code and inputs, so a rerun after a failure
    resumes at the step that failed. Ctrl-C stops every job it started. Exit code: 0 finished,
    1 a job failed, 130 stopped, 2 invalid recipe or GPU assignment.
    """
    if plan.supervise_run:
        _supervise(ctx, plan.supervise_run)
    if plan.list_recipes or not recipe:
        _list_recipes(recipe, plan.list_recipes)
        return
    as_json, dry_run, overrides, rerun = output == "json", job.dry_run, plan.overrides, plan.rerun
    explicit = job.workspace or (ctx.find_root().obj or {}).get("workspace")
    prepared = _prepare_or_fail(recipe, overrides, explicit, rerun)
    use_cache = not plan.no_cache
    if plan.backend == "slurm":
        _run_slurm(prepared, dry_run=dry_run, detach=plan.detach, as_json=as_json)
        return
    _print_plan(prepared, use_cache, rerun, as_json=as_json, dry_run=dry_run)
    if dry_run:
        _warn_gpus(prepared)
        return
    if plan.detach:
        _run_detached(prepared, use_cache, rerun, as_json)
        return
    rerun_hint = shlex.join(["adaflash", *(["--workspace", explicit] if explicit else []), "run", recipe,
                             *(f"--set={o}" for o in overrides)])
    sys.exit(_run_attached(prepared, use_cache, rerun, as_json, plan.progress_every, rerun_hint))


def _supervise(ctx: click.Context, run_id: str) -> None:
    """--foreground-supervisor: supervise a recorded run (the --detach background process); exits."""
    from adaflash.cli.common import workspace_of
    from jobs.detached import supervise_existing

    sys.exit(supervise_existing(workspace_of(ctx), run_id).exit_code)


def _list_recipes(recipe: str | None, list_recipes: bool) -> None:
    """--list: the shipped recipes; no RECIPE and no --list: an error naming them."""
    from jobs.recipe import shipped_recipes

    shipped = [p.stem for p in shipped_recipes()]
    if not recipe and not list_recipes:
        fail(f"missing RECIPE (a .toml file or a shipped recipe: {', '.join(shipped)})")
    click.echo("\n".join(shipped))


def _prepare_or_fail(recipe: str, overrides: tuple[str, ...], workspace: str | None, rerun: tuple[str, ...]) -> Any:
    """The recipe read, validated and planned, or a clean error naming what is wrong."""
    from jobs.plan import prepare
    from jobs.recipe import RecipeError

    try:
        prepared = prepare(recipe, overrides, workspace=workspace)
    except RecipeError as err:
        fail(f"invalid recipe:\n{err}")
    except ValueError as err:
        fail(str(err))
    unknown = sorted(set(rerun) - set(prepared.recipe.jobs))
    if unknown:
        fail(f"--rerun: no job {', '.join(unknown)} in recipe {prepared.recipe.name} "
             f"(jobs: {', '.join(prepared.recipe.order())})")
    return prepared


def _print_plan(prepared: Any, use_cache: bool, rerun: tuple[str, ...], *, as_json: bool, dry_run: bool) -> None:
    """The plan as text (what runs, what is reused); as JSON only for a dry run."""
    if as_json and dry_run:
        click.echo(json.dumps({"run_id": prepared.run_id, "run_dir": str(prepared.run_dir),
                               "workspace": str(prepared.workspace),
                               "cache_dir": str(prepared.cache_dir) if prepared.cache_dir else None,
                               "gpus": prepared.recipe.assignment.to_dict(),
                               "jobs": [row.to_dict() for row in prepared.plan(preview=True, use_cache=use_cache,
                                                                                rerun=rerun)]}, indent=2))
    elif not as_json:
        click.echo(prepared.plan_text(use_cache=use_cache, rerun=rerun))


def _run_detached(prepared: Any, use_cache: bool, rerun: tuple[str, ...], as_json: bool) -> None:
    from adaflash.runlog import RunLog
    from jobs.assign import AssignmentError, LeaseError
    from jobs.detached import start_detached

    runlog = RunLog.open(prepared.workspace)
    try:
        run_id = start_detached(prepared, runlog, use_cache=use_cache, rerun=rerun)
    except (AssignmentError, LeaseError) as err:
        fail(str(err))
    except RuntimeError as err:
        fail(str(err), code=1)
    pid = runlog.get_run(run_id)["pid"]
    if as_json:
        click.echo(json.dumps({"run_id": run_id, "supervisor_pid": pid, "status": "running"}))
    else:
        click.echo(f"\nrun {run_id} is running in the background (supervisor pid {pid})\n"
                   f"  follow: adaflash runs attach {run_id}\n  stop:   adaflash runs stop {run_id}")


def _run_attached(prepared: Any, use_cache: bool, rerun: tuple[str, ...], as_json: bool, progress_every: float,
                  rerun_hint: str) -> int:
    """Start the jobs, show where the run stands until they end, then the summary; returns the exit code."""
    from rich.console import Console

    from adaflash.runlog import RunLog
    from jobs.assign import AssignmentError, LeaseError
    from jobs.runner import Runner, install_signal_handlers
    from jobs.watch import run_view

    console = Console(stderr=False, highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)  # a log file (CI, | tee) has room for the tables
    runlog = RunLog.open(prepared.workspace)
    runner = Runner(prepared, runlog, use_cache=use_cache, rerun=rerun)
    try:
        runner.start()
    except (AssignmentError, LeaseError) as err:
        fail(str(err))
    restore = install_signal_handlers(runner)
    display = ProgressDisplay(console, runlog, prepared.run_id, every=progress_every, quiet=as_json)
    state = {"after": 0, "last": 0.0}

    def on_tick(_runner: Any) -> None:
        now = time.monotonic()
        if now - state["last"] < 0.5:
            return
        state["last"] = now
        view = run_view(runlog, prepared.run_id, events_after=state["after"])
        state["after"] = max(state["after"], view.last_event_id)
        display.update(view)

    try:
        with display:
            result = runner.run(on_tick=on_tick)
    finally:
        restore()
    view = run_view(runlog, prepared.run_id, events_after=state["after"])
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "jobs": view.jobs}, indent=2, default=str))
    else:
        for event in view.events:
            print_event(console, event)
        console.print()
        print_final(console, runlog, prepared, result, view, display.previous, rerun_hint)
    return result.exit_code


def _warn_gpus(prepared: Any) -> None:
    """On --dry-run, say (without failing) when this machine lacks the recipe's GPUs."""
    if not prepared.recipe.gpus_in_use():
        return
    from jobs.gpus import snapshot

    errors = prepared.recipe.gpu_errors(snapshot(cpu_interval=None))
    for error in errors:
        click.secho(f"note: on this machine: {error}", fg="yellow", err=True)


def _run_slurm(prepared: Any, *, dry_run: bool, detach: bool, as_json: bool) -> None:
    from adaflash.runlog import RunLog
    from jobs import slurm

    try:
        script = slurm.render_script(prepared)
    except slurm.SlurmError as err:
        fail(str(err))
    if dry_run:
        if as_json:
            click.echo(json.dumps({"run_id": prepared.run_id, "script": script}, indent=2))
        else:
            click.echo(script)
        return
    tracker = slurm.SlurmRun(prepared, RunLog.open(prepared.workspace))
    try:
        job_id = tracker.submit()
    except slurm.SlurmError as err:
        fail(str(err), code=1)
    click.echo(f"run {prepared.run_id}: submitted as Slurm job {job_id} (script {prepared.run_dir / slurm.SCRIPT_NAME})")
    if detach:
        click.echo(f"  follow: adaflash runs attach {prepared.run_id}   stop: adaflash runs stop {prepared.run_id}")
        return
    follow_slurm(tracker, click.echo, interrupt_code=130)
