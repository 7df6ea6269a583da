"""How a recipe run looks while it runs and when it ends: the live table, event lines, the summary.

A live table on a terminal, one plain line per event and a heartbeat line every `--progress-every`
seconds in a log (CI, `| tee`); `adaflash run` and `adaflash runs attach` both show runs this way.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adaflash.cli.common import fail, fmt_cell

STATUS_STYLE = {
    "pending": "dim", "starting": "yellow", "running": "cyan", "ready": "green", "finished": "green",
    "failed": "bold red", "stopped": "magenta", "restarting": "yellow", "cached": "blue",
}
STATUS_MARK = {"finished": "✓", "cached": "↺", "failed": "✗", "stopped": "■", "running": "▶", "starting": "▶",
               "ready": "▶", "restarting": "↻", "pending": "·"}


def _progress_of(runlog: Any, view: Any, previous: dict[str, float] | None = None) -> Any:
    from jobs.progress import run_progress

    return run_progress(runlog, view, previous=previous)


def render_view(view: Any, progress: Any = None) -> Any:
    """A rich renderable of a run: one row per step with its own progress, then the latest metrics."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from jobs.progress import format_seconds

    run = view.run
    title = f"run {run['id']} ({run.get('name')}) - {run['status']}"
    if progress is not None:
        title += f" - {progress.completed}/{progress.total} steps done - {format_seconds(progress.elapsed)}"
    if view.orphaned:
        title += " - supervisor gone"
    table = Table(title=title, title_justify="left", expand=False)
    for column in ("step", "job", "status", "GPUs", "time", "progress / note"):
        table.add_column(column, overflow="fold")
    steps = {s.name: s for s in progress.steps} if progress is not None else {}
    for index, job in enumerate(view.jobs, start=1):
        status = job["status"] or ""
        step = steps.get(job["name"])
        note = (job.get("message") or "").splitlines()[0] if job.get("message") else ""
        if step is not None and step.status in ("starting", "running", "ready", "restarting"):
            note = step.detail() or (step.description or "")
        elif not note and step is not None and status == "pending":
            note = step.description or ""
        timing = step.timing() if step is not None else _uptime(job)
        table.add_row(
            f"{index}/{len(view.jobs)}", job["name"],
            Text(f"{STATUS_MARK.get(status, ' ')} {status}", style=STATUS_STYLE.get(status, "")),
            job.get("gpus") or "cpu", timing, note[:90],
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


def _uptime(job: dict[str, Any]) -> str:
    from jobs.progress import format_seconds

    start = job.get("started_at")
    return format_seconds((job.get("ended_at") or time.time()) - start) if start else ""


def print_event(console: Any, event: dict[str, Any]) -> None:
    stamp = time.strftime("%H:%M:%S", time.localtime(event["time"]))
    style = {"error": "red", "warning": "yellow"}.get(event.get("level") or "", "")
    first, *rest = (event.get("message") or "").splitlines() or [""]
    console.print(f"[dim]{stamp}[/dim] [{style}]{first}[/{style}]" if style else f"[dim]{stamp}[/dim] {first}",
                  highlight=False, markup=True, soft_wrap=True)
    for line in rest:
        console.print(f"         {line}", highlight=False, markup=False, soft_wrap=True)


class ProgressDisplay:
    """Events as they come, plus where the run stands: a live table on a terminal, else plain lines.

    In a plain log a progress line is printed after each batch of events and at least every
    `every` seconds while something runs, so a CI log always says what is happening.
    """

    def __init__(self, console: Any, runlog: Any, run_id: str, *, live_ok: bool = True, every: float = 30.0,
                 quiet: bool = False) -> None:
        from jobs.progress import previous_durations

        self.console, self.runlog, self.run_id = console, runlog, run_id
        self.every, self.quiet = every, quiet
        run = runlog.get_run(run_id)
        self.previous = previous_durations(runlog, run.get("name"), exclude=run["id"])
        self.live = None
        if live_ok and console.is_terminal and not quiet:
            from rich.live import Live

            self.live = Live(console=console, auto_refresh=False, transient=True)
        self._last_line = 0.0

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.live.stop()

    def update(self, view: Any) -> Any:
        if self.quiet:
            return None
        progress = _progress_of(self.runlog, view, self.previous)
        for event in view.events:
            print_event(self.console, event)
        if self.live:
            self.live.update(render_view(view, progress), refresh=True)
            return progress
        now = time.monotonic()
        if progress.active and (view.events or now - self._last_line >= self.every):
            self.console.print(progress.line(), highlight=False, markup=False, soft_wrap=True)
            self._last_line = now
        return progress


def follow(runlog: Any, run_id: str, console: Any, *, interval: float = 0.5, live_ok: bool = True,
           tick: Any = None, every: float = 30.0) -> Any:
    """Print new events and keep the progress of the run on screen until it ends; returns the last view."""
    from jobs.watch import follow_run

    view = None
    with ProgressDisplay(console, runlog, run_id, live_ok=live_ok, every=every) as display:
        for view in follow_run(runlog, run_id, interval=interval):
            display.update(view)
            if tick:
                tick(view)
    return view


def follow_slurm(tracker: Any, echo: Callable[[str], None], *, interrupt_code: int, interval: float = 10.0) -> None:
    """Follow a run submitted to Slurm until it leaves the queue, then exit with the run's code.

    One place for `adaflash run --backend slurm` and `adaflash runs attach`: each state change is
    printed once; Ctrl-C only stops following (the Slurm job goes on).
    """
    from jobs import slurm

    last: dict[str, str | None] = {"state": None}

    def on_tick(state: Any) -> None:
        if state.state != last["state"]:
            last["state"] = state.state
            echo(f"{time.strftime('%H:%M:%S')} slurm job {tracker.job_id}: {state.state}")

    run_id = tracker.prepared.run_id
    try:
        result = tracker.track(interval=interval, on_tick=on_tick)
    except KeyboardInterrupt:
        echo(f"stopped following; the Slurm job goes on (adaflash runs stop {run_id} cancels it)")
        sys.exit(interrupt_code)
    except slurm.SlurmError as err:
        fail(str(err), code=1)
    echo(f"run {result.run_id} {result.status}: {result.message}")
    sys.exit(result.exit_code)


def summary_output(log_path: str | Path) -> str:
    """What a job printed in its last start (the part of its log after adaflash's last start header)."""
    from jobs.supervisor import clean_log_text

    try:
        text = clean_log_text(Path(log_path).read_text(errors="replace"))
    except OSError:
        return ""
    marker = text.rfind("=== adaflash: start")
    if marker >= 0:
        text = text[text.find("\n", marker) + 1:]
    return text.strip("\n")


def print_final(console: Any, runlog: Any, prepared: Any, result: Any, view: Any, previous: dict[str, float],
                rerun_hint: str) -> None:
    """After a foreground run: each step with its time, the summary jobs' output, where everything is."""
    from rich.table import Table

    from jobs.progress import format_seconds, run_progress

    progress = run_progress(runlog, view, previous=previous)
    console.print(f"run {result.run_id}: {progress.completed}/{progress.total} steps done in "
                  f"{format_seconds(progress.elapsed)}", markup=False, soft_wrap=True)
    table = Table()
    for column in ("step", "job", "status", "time", "note"):
        table.add_column(column, overflow="fold")
    for step in progress.steps:
        time_text = "" if step.status == "cached" else format_seconds(step.elapsed)
        table.add_row(f"{step.index}/{progress.total}", step.name,
                      f"{STATUS_MARK.get(step.status, ' ')} {step.status}", time_text, (step.note or "")[:100])
    console.print(table)
    for name, spec in prepared.recipe.jobs.items():
        state = next((j for j in view.jobs if j["name"] == name), None)
        if spec.summary and state and state["status"] in ("finished", "cached") and state.get("log_path"):
            text = summary_output(state["log_path"])
            if text:
                console.print(f"\n[bold]{spec.description or name}[/bold] (from {state['log_path']})\n")
                console.print(text, markup=False, highlight=False, soft_wrap=True)
    console.print()
    color = {"finished": "green", "failed": "red"}.get(result.status, "magenta")
    console.print(f"[{color}]run {result.run_id} {result.status}[/{color}]: {result.message}", soft_wrap=True)
    if result.status in ("failed", "stopped"):
        done = [s.name for s in progress.steps if s.status in ("finished", "cached")
                and s.name in prepared.recipe.jobs and prepared.recipe.jobs[s.name].cacheable]
        for name, log_path in result.failed_logs.items():
            console.print(f"  failed step: {name}   log: {log_path}", markup=False, soft_wrap=True)
        if done:
            first = "fix the cause and run" if result.status == "failed" else "run"
            console.print(f"  {first} `{rerun_hint}` again: the {len(done)} step(s) that finished "
                          f"({', '.join(done)}) are reused and the run resumes at the first that did not.",
                          markup=False, soft_wrap=True)
    ws = prepared.workspace
    lines = [
        ("run log", f"{ws / 'runlog.sqlite'}  (adaflash --workspace {ws} runs show {result.run_id})"),
        ("job logs", f"{prepared.run_dir}/<job>.log"),
    ]
    if prepared.cache_dir and any(j.cacheable for j in prepared.recipe.jobs.values()):
        lines.append(("cache", f"{prepared.cache_dir}  (reused while inputs match; --no-cache runs every step)"))
    lines.append(("dashboard", f"adaflash-tui --workspace {shlex.quote(str(ws))} --run {result.run_id}"))
    for label, text in lines:
        console.print(f"  {label + ':':<11}{text}", markup=False, highlight=False, soft_wrap=True)
