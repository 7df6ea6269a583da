"""Helpers every command shares: the workspace, the run log, output formats and clean errors."""

from __future__ import annotations

import csv
import io
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from adaflash.files import nearest_existing
from adaflash.runlog import RunLog
from adaflash.workspace import DEFAULT_WORKSPACE, RUNLOG_FILE, WORKSPACE_ENV, workspace_dir, workspace_path


def _workspace_option(ctx: click.Context) -> str | None:
    root = ctx.find_root()
    return (root.obj or {}).get("workspace") if root.obj else None


def workspace_path_of(ctx: click.Context) -> Path:
    """The workspace `--workspace` (or its default) names, not created."""
    return workspace_path(_workspace_option(ctx))


def workspace_of(ctx: click.Context) -> str:
    """The workspace, created: for commands that record something there."""
    return str(workspace_dir(_workspace_option(ctx)))


def say_waiting(message: str) -> None:
    """What a command prints while another process holds the run log's write lock."""
    click.secho(f"waiting: {message}", fg="yellow", err=True)


def runlog_of(ctx: click.Context) -> RunLog:
    """The workspace's run log (checked for damage before anything is written), with runs killed without
    recording an end marked as such first."""
    log = RunLog.open(workspace_of(ctx), check=True, on_wait=say_waiting)
    log.reap_lost_runs()
    return log


def existing_runlog_of(ctx: click.Context) -> RunLog:
    """The run log for commands that only read or act on recorded runs: a workspace with no run log
    (a mistyped --workspace, say) is an error naming it, and nothing is created there. Opening it never
    waits for the write lock: lost runs are marked only when no other process is writing."""
    workspace = workspace_path_of(ctx)
    if not (workspace / RUNLOG_FILE).exists():
        fail(f"no run log in workspace {workspace}: nothing has been recorded there (the workspace is "
             f"--workspace, else ${WORKSPACE_ENV}, else ./{DEFAULT_WORKSPACE})")
    log = RunLog.open(workspace, check=True, on_wait=say_waiting)
    log.reap_lost_runs(wait=False)
    return log


WHOLE_COLUMNS = ("id", "run_id", "run")


def emit_rows(rows: list[dict[str, Any]], columns: Sequence[str], fmt: str, *, title: str | None = None) -> None:
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        click.echo(buffer.getvalue(), nl=False)
        return
    if fmt == "markdown":
        click.echo("| " + " | ".join(columns) + " |")
        click.echo("|" + "---|" * len(columns))
        for row in rows:
            click.echo("| " + " | ".join(fmt_cell(row.get(c)) for c in columns) + " |")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for column in columns:
        if column in WHOLE_COLUMNS:  # ids are copied into the next command: never shortened
            width = max([len(column), *(len(fmt_cell(row.get(column))) for row in rows)])
            table.add_column(column, no_wrap=True, min_width=width)
        else:  # paths and notes wrap rather than lose their end
            table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(fmt_cell(row.get(c)) for c in columns))
    Console(width=max(120, Console().width)).print(table)


def fmt_cell(value: Any) -> str:
    """A value for a table cell; N/A for missing so formatting never crashes."""
    if value is None:
        return "N/A"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def drafter_folder(option: str, value: str | None) -> str | None:
    """A drafter folder or built-in drafter name → the folder, checked before any model loads."""
    from adaflash.models.registry import resolve_drafter

    if value is None:
        return None
    folder = resolve_drafter(value)
    if not folder.is_dir():
        raise click.BadParameter(f"{value}: no such drafter folder (nor a built-in drafter)", param_hint=option)
    return str(folder)


def chosen_drafter(method: str, draft: str | None, target: str) -> str | None:
    """`--draft`, or the built-in drafter of a built-in target (said on stderr); ValueError if there is none."""
    from adaflash.engine.build import drafter_for

    chosen = drafter_for(method, draft, target)
    if chosen and not draft:
        note_builtin_drafter(f"--method {method} runs", chosen, "--draft")
    return chosen


def writable_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An --out file whose folder exists or can be made, and can be written: checked before the work that
    fills it (a long regeneration failed only when it wrote its result)."""
    if value is None:
        return None
    folder = nearest_existing(Path(value).expanduser())
    if not folder.is_dir():
        raise click.BadParameter(f"{value}: {folder} is a file, not a folder")
    try:  # a real write: permissions alone do not tell (root, read-only mounts, /proc)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise click.BadParameter(f"{value}: {folder} cannot be written ({err.strerror or err})") from None
    return value


def note_builtin_drafter(what: str, name: str, option: str) -> None:
    """Say on stderr that a default built-in drafter was taken, and how to choose another."""
    click.secho(f"note: {what} the built-in drafter {name} ({option} to choose another)", fg="bright_black", err=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a clear error (no traceback) and exit."""
    click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(code)


def run_or_fail(log: RunLog, run_id: str) -> dict[str, Any]:
    """The run, or a clean error naming the unknown id."""
    try:
        return log.get_run(run_id)
    except KeyError as err:
        fail(err.args[0])


class RecordedRun:
    """A run-log entry that `recorded_run` owns: its id, and how it is to end (set by `finish`)."""

    def __init__(self, log: RunLog, run_id: str) -> None:
        self.log, self.id = log, run_id
        self.status, self.note = "finished", None
        self.closed = False

    def finish(self, status: str = "finished", note: str | None = None) -> None:
        """How the run ends if the body returns normally (recorded on the way out)."""
        self.status, self.note = status, note

    def set_status(self, status: str, **fields: Any) -> None:
        """A status while it runs (pending -> running), with any other field of the run."""
        self.log.update_run(self.id, status=status, **fields)

    def metrics(self, values: dict[str, Any], **kwargs: Any) -> None:
        self.log.log_metrics(self.id, values, **kwargs)

    def close(self, status: str, note: str | None) -> None:
        if not self.closed:
            self.closed = True
            self.log.finish_run(self.id, status, **({"note": note} if note else {}))


@contextmanager
def recorded_run(log: RunLog, kind: str, *, expected: tuple[type[BaseException], ...] = (),
                 **fields: Any) -> Iterator[RecordedRun]:
    """Create a run in the run log and end it however the body ends, so no command leaves one "running":
    finished (or as `run.finish` said); failed with the error as its note (an `expected` error also becomes
    a one-line CLI error, exit 2); stopped on Ctrl-C (which propagates, exit 130).
    """
    options = _group_records()
    if options:
        fields["config"] = {**(fields.get("config") or {}), "options": options}
    run = RecordedRun(log, log.create_run(kind, **fields))
    try:
        yield run
    except expected as err:
        run.close("failed", str(err))
        fail(str(err))
    except KeyboardInterrupt:
        run.close("stopped", "interrupted")
        raise
    except SystemExit as err:  # fail() inside the body (it printed the reason), or exit 130 after a stop
        ok = err.code in (None, 0)
        status = run.status if ok else "stopped" if err.code == 130 else "failed"
        run.close(status, run.note if ok else (run.note or f"exit code {err.code}"))
        raise
    except BaseException as err:
        run.close("failed", f"{type(err).__name__}: {err}")
        raise
    run.close(run.status, run.note)


def _group_records() -> dict[str, Any]:
    """The option groups of the running command, as `cli.groups.uses` built them (none outside a command)."""
    ctx = click.get_current_context(silent=True)
    return dict(ctx.meta.get("adaflash.groups", {})) if ctx is not None else {}


def argv_of(ctx: click.Context, leave_out: set[str]) -> list[str]:
    """The command line that gives this command its values again (the program itself not included),
    every option spelt out, without the options named in `leave_out`: for copies of a command that
    run in child processes with a few options of their own."""
    chain = []
    at: click.Context | None = ctx
    while at is not None:
        chain.insert(0, at)
        at = at.parent
    argv: list[str] = []
    for depth, level in enumerate(chain):
        if depth:
            argv.append(level.info_name or "")
        for param in level.command.params:
            if not isinstance(param, click.Option) or param.name in leave_out or param.name not in level.params:
                continue
            value = level.params[param.name]
            if param.is_flag:
                if param.secondary_opts:
                    argv.append(param.opts[0] if value else param.secondary_opts[0])
                elif value:
                    argv.append(param.opts[0])
            elif value is not None:
                values = value if param.multiple else (value,)
                argv.extend(f"{param.opts[0]}={v}" for v in values)
    return argv
