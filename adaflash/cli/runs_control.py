"""`adaflash runs attach|stop`: follow and stop recipe runs, detached ones included."""

from __future__ import annotations

import sys

import click

from adaflash.cli.common import existing_runlog_of, fail, run_or_fail
from adaflash.cli.groups import use, uses
from adaflash.options import JobConfig, RunsConfig


@click.command("attach")
@click.argument("run_id")
@uses(use(JobConfig, only=("interval",), notes={"interval": "Here: between reads of the run log."}),
      command="runs attach")
@click.pass_context
def attach_run(ctx: click.Context, run_id: str, job: JobConfig) -> None:
    """Follow a run's jobs, events and metrics until it ends (Ctrl-C detaches; the run goes on)."""
    from rich.console import Console

    from adaflash.cli.run_display import follow, render_view
    from jobs.progress import previous_durations, run_progress
    from jobs.runner import EXIT_CODES
    from jobs.watch import run_view

    log = existing_runlog_of(ctx)
    run = run_or_fail(log, run_id)
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    console = Console(highlight=False)
    if config.get("backend") == "slurm":
        _attach_slurm(log, run["id"], console)
        return
    try:
        view = follow(log, run["id"], console, interval=job.interval)
    except KeyboardInterrupt:
        console.print(f"detached; run {run['id']} goes on (adaflash runs stop {run['id']} stops it)")
        sys.exit(0)
    view = run_view(log, run["id"], events_after=view.last_event_id if view else 0)
    console.print(render_view(view, run_progress(log, view, previous=previous_durations(log, run.get("name"),
                                                                                        exclude=run["id"]))))
    if view.orphaned:
        console.print(f"[red]run {view.run['id']} is recorded as {view.status} but its supervisor is gone[/red]"
                      f" (adaflash runs stop {view.run['id']} stops what is left of its jobs)")
        sys.exit(1)
    console.print(f"run {view.run['id']} {view.status}" + (f": {view.run['note']}" if view.run.get("note") else ""))
    sys.exit(EXIT_CODES.get(view.status, 1))


def _attach_slurm(log, run_id: str, console) -> None:
    from adaflash.cli.run_display import follow_slurm
    from jobs import slurm

    try:
        tracker = slurm.SlurmRun.resume(log, run_id)
    except slurm.SlurmError as err:
        fail(str(err))
    follow_slurm(tracker, lambda text: console.print(text, markup=False, highlight=False), interrupt_code=0)


@click.command("stop")
@click.argument("run_id")
@uses(use(RunsConfig, only=("grace", "job_name", "restart")), command="runs stop")
@click.pass_context
def stop_run(ctx: click.Context, run_id: str, runs: RunsConfig) -> None:
    """Stop a run: its verified supervisor stops every job; if the supervisor is gone, its job groups are
    stopped directly (each pid checked against its recorded create time)."""
    from jobs import control

    grace, job_name, restart = runs.grace, runs.job_name, runs.restart

    log = existing_runlog_of(ctx)
    run = run_or_fail(log, run_id)
    if restart and not job_name:
        fail("--restart needs --job NAME")
    if job_name:
        if job_name not in {j["name"] for j in log.jobs(run["id"])}:
            fail(f"run {run['id']} has no job {job_name!r}")
        if control.supervisor_pid(run) is None:
            fail(f"run {run['id']} has no live supervisor to ask")
        control.request_job_action(run["run_dir"], "restart" if restart else "stop", job_name)
        click.echo(f"asked the supervisor of run {run['id']} to {'restart' if restart else 'stop'} job {job_name}")
        return
    try:
        result = control.stop_run(log, run["id"], grace=grace)
    except Exception as err:  # noqa: BLE001 - scancel missing, permission denied: say it plainly
        fail(f"could not stop run {run['id']}: {err}", code=1)
    if result.how == "already ended":
        click.echo(f"run {result.run_id} had already ended ({result.status})"
                   + (f"; stopped leftover jobs: {', '.join(result.stopped_jobs)}" if result.stopped_jobs else ""))
    else:
        jobs = f" (jobs: {', '.join(result.stopped_jobs)})" if result.stopped_jobs else ""
        click.echo(f"run {result.run_id} {result.status} via {result.how}{jobs}")
