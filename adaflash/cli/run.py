"""`adaflash run RECIPE`: plan, then run a recipe's jobs headless with live progress.

The control plane lives in `jobs` (no torch); this module only renders and wires signals.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from adaflash.cli.common import fail, fmt_cell

STATUS_STYLE = {
    "pending": "dim", "starting": "yellow", "running": "cyan", "ready": "green", "finished": "green",
    "failed": "bold red", "stopped": "magenta", "restarting": "yellow",
}


def _uptime(job: dict[str, Any]) -> str:
    start = job.get("started_at")
    if not start:
        return ""
    seconds = int((job.get("ended_at") or time.time()) - start)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def render_view(view: Any) -> Any:
    """A rich renderable of a run: its jobs and its latest metrics (jobs.runner.RunView)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    run = view.run
    title = f"run {run['id']} ({run.get('name')}) - {run['status']}"
    if view.orphaned:
        title += " - supervisor gone"
    table = Table(title=title, title_justify="left", expand=False)
    for column in ("job", "status", "GPUs", "pid", "restarts", "uptime", "exit", "note"):
        table.add_column(column, overflow="fold")
    for job in view.jobs:
        note = (job.get("message") or "").splitlines()[0] if job.get("message") else ""
        table.add_row(
            job["name"], Text(job["status"] or "", style=STATUS_STYLE.get(job["status"] or "", "")),
            job.get("gpus") or "cpu", fmt_cell(job.get("pid")) if job.get("pid") else "",
            str(job.get("restarts") or 0), _uptime(job),
            "" if job.get("exit_code") is None else str(job["exit_code"]), note[:60],
        )
    parts: list[Any] = [table]
    if view.metrics:
        metrics = Table(title="latest metrics", title_justify="left")
        metrics.add_column("metric")
        metrics.add_column("value", justify="right")
        for name, value in sorted(view.metrics.items())[:20]:
            metrics.add_row(name, fmt_cell(value))
        parts.append(metrics)
    return Group(*parts)


def print_event(console: Any, event: dict[str, Any]) -> None:
    stamp = time.strftime("%H:%M:%S", time.localtime(event["time"]))
    style = {"error": "red", "warning": "yellow"}.get(event.get("level") or "", "")
    first, *rest = (event.get("message") or "").splitlines() or [""]
    console.print(f"[dim]{stamp}[/dim] [{style}]{first}[/{style}]" if style else f"[dim]{stamp}[/dim] {first}",
                  highlight=False)
    for line in rest:
        console.print(f"         {line}", highlight=False, markup=False)


def follow(runlog: Any, run_id: str, console: Any, *, interval: float = 0.5, live_ok: bool = True,
           tick: Any = None) -> Any:
    """Print new events and keep a live table of the run until it ends; returns the last view."""
    from rich.live import Live

    from jobs.runner import follow_run

    view = None
    use_live = live_ok and console.is_terminal
    live = Live(console=console, auto_refresh=False, transient=False) if use_live else None
    try:
        if live:
            live.start()
        for view in follow_run(runlog, run_id, interval=interval):
            for event in view.events:
                print_event(console, event)
            if live:
                live.update(render_view(view), refresh=True)
            if tick:
                tick(view)
    finally:
        if live:
            live.stop()
    return view


@click.command("run", context_settings={"show_default": True})
@click.argument("recipe", required=False)
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a recipe value (TOML literal, else a string), e.g. --set gpus.training=[1,2].")
@click.option("--dry-run", is_flag=True, help="Print the plan (exact command lines and GPUs) and stop.")
@click.option("--detach", is_flag=True, help="Supervise in the background; follow with `adaflash runs attach RUN`.")
@click.option("--workspace", type=click.Path(file_okay=False), default=None,
              help="Workspace for this run (default: the global --workspace, the recipe's, ./adaflash-workspace).")
@click.option("--backend", type=click.Choice(["local", "slurm"]), default="local",
              help="local: subprocesses here; slurm: an sbatch script submitted to the cluster.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (and the result) as JSON.")
@click.option("--list", "list_recipes", is_flag=True, help="List the shipped recipes and exit.")
@click.option("--foreground-supervisor", "supervise_run", hidden=True, metavar="RUN_ID",
              help="Internal: supervise an already recorded run (the --detach background process).")
@click.pass_context
def run(ctx: click.Context, recipe: str | None, overrides: tuple[str, ...], dry_run: bool, detach: bool,
        workspace: str | None, backend: str, as_json: bool, list_recipes: bool, supervise_run: str | None) -> None:
    """Run a recipe (TOML, or a shipped recipe's name): plan, start its jobs, supervise them.

    Jobs start as subprocesses in their own process groups, logs in <workspace>/runs/<run>/<job>.log,
    each recorded in the run log. Ctrl-C stops every job it started. Exit code: 0 finished,
    1 a job failed, 130 stopped, 2 invalid recipe or GPU assignment.
    """
    from adaflash.cli.common import workspace_of

    if supervise_run:
        from jobs.runner import supervise_existing

        sys.exit(supervise_existing(workspace_of(ctx), supervise_run).exit_code)

    from jobs.recipe import RecipeError, shipped_recipes

    if list_recipes or not recipe:
        shipped = [p.stem for p in shipped_recipes()]
        if not recipe and not list_recipes:
            fail(f"missing RECIPE (a .toml file or a shipped recipe: {', '.join(shipped)})")
        click.echo("\n".join(shipped))
        return
    from jobs.assign import AssignmentError, LeaseError
    from jobs.runner import prepare

    root = ctx.find_root()
    explicit = workspace or (root.obj or {}).get("workspace")
    try:
        prepared = prepare(recipe, overrides, workspace=explicit)
    except RecipeError as err:
        fail(f"invalid recipe:\n{err}")
    except ValueError as err:
        fail(str(err))
    if backend == "slurm":
        _run_slurm(prepared, dry_run=dry_run, detach=detach, as_json=as_json)
        return
    if as_json and dry_run:
        click.echo(json.dumps({"run_id": prepared.run_id, "run_dir": str(prepared.run_dir),
                               "workspace": str(prepared.workspace),
                               "gpus": prepared.recipe.assignment.to_dict(),
                               "jobs": [row.to_dict() for row in prepared.plan()]}, indent=2))
    elif not as_json:
        click.echo(prepared.plan_text())
    if dry_run:
        _warn_gpus(prepared)
        return

    from rich.console import Console

    from adaflash.runlog import RunLog
    from jobs.runner import Runner, install_signal_handlers, start_detached

    console = Console(stderr=False, highlight=False)
    runlog = RunLog.open(prepared.workspace)
    if detach:
        try:
            run_id = start_detached(prepared, runlog)
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
        return

    runner = Runner(prepared, runlog)
    try:
        runner.start()
    except (AssignmentError, LeaseError) as err:
        fail(str(err))
    restore = install_signal_handlers(runner)
    from rich.live import Live

    from jobs.runner import run_view

    live = Live(console=console, auto_refresh=False) if console.is_terminal and not as_json else None
    state = {"after": 0, "last": 0.0}

    def on_tick(_runner: Any) -> None:
        now = time.monotonic()
        if now - state["last"] < 0.5:
            return
        state["last"] = now
        view = run_view(runlog, prepared.run_id, events_after=state["after"])
        state["after"] = max(state["after"], view.last_event_id)
        if not as_json:
            for event in view.events:
                print_event(console, event)
        if live:
            live.update(render_view(view), refresh=True)

    try:
        if live:
            live.start()
        result = runner.run(on_tick=on_tick)
    finally:
        if live:
            live.stop()
        restore()
    view = run_view(runlog, prepared.run_id, events_after=state["after"])
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "jobs": view.jobs}, indent=2, default=str))
    else:
        for event in view.events:
            print_event(console, event)
        console.print(render_view(view))
        color = {"finished": "green", "failed": "red"}.get(result.status, "magenta")
        console.print(f"[{color}]run {result.run_id} {result.status}[/{color}]: {result.message}")
    sys.exit(result.exit_code)


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
    last = {"state": None}

    def on_tick(state: Any) -> None:
        if state.state != last["state"]:
            last["state"] = state.state
            click.echo(f"{time.strftime('%H:%M:%S')} slurm job {job_id}: {state.state}")

    try:
        result = tracker.track(on_tick=on_tick)
    except KeyboardInterrupt:
        click.echo(f"stopped following; the Slurm job goes on (adaflash runs stop {prepared.run_id} cancels it)")
        sys.exit(130)
    click.echo(f"run {result.run_id} {result.status}: {result.message}")
    sys.exit(result.exit_code)
