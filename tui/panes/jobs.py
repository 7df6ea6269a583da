"""Jobs: every job of the current run (and of the runs its jobs created) with status, GPUs,
uptime and restarts; the selected job's log tail, live; stop/restart with a confirmation."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import DataTable, Input, Label, Static

from tui.actions import bindings_for
from tui.backend import LIVE_RUN_STATUSES, LogChunk, RunState, is_active
from tui.logview import LogView, first
from tui.modals import ConfirmScreen
from tui.panes.base import Pane
from tui.widgets import Col, FitTable

ERROR_LINE = re.compile(r"\b(error|traceback|exception|failed)\b", re.IGNORECASE)
STATUS_STYLE = {
    "pending": "dim", "starting": "yellow", "running": "cyan", "ready": "bold green", "finished": "green",
    "failed": "bold red", "stopped": "magenta", "restarting": "yellow", "detached": "cyan", "cached": "blue",
}
# What stays when the terminal is narrow: the job, its status and where a service answers, then the rest.
COLUMNS = [Col("job", "job"), Col("role", "role", 6), Col("status", "status"), Col("gpus", "GPUs", 3),
           Col("url", "serves at", 1, hide_empty=True), Col("pid", "pid", 7), Col("uptime", "uptime", 4),
           Col("restarts", "restarts", 8), Col("exit", "exit", 2), Col("note", "note", 5)]


def uptime(job: dict[str, Any], now: float | None = None) -> str:
    start = job.get("started_at")
    if not start:
        return ""
    seconds = max(0, int((job.get("ended_at") or now or time.time()) - start))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def status_text(status: str | None) -> Text:
    return Text(status or "", style=STATUS_STYLE.get(status or "", ""))


@dataclass(frozen=True)
class JobRow:
    key: str
    run_id: str
    name: str  # as the supervisor knows it (control requests use it)
    label: str  # as shown: child-run jobs are prefixed by the job that created their run
    controllable: bool
    job: dict[str, Any]


class JobsPane(Pane):
    SCOPE = "jobs"
    INTERVAL = 1.0
    BINDINGS = bindings_for("jobs")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id: str | None = None
        self.state: RunState | None = None
        self.rows: dict[str, JobRow] = {}
        self.selected: str | None = None
        self.log_path: str | None = None
        self.log_offset = 0
        self.stopping: set[str] = set()  # runs whose stop is under way (a pipeline finishing its step)
        self.log_line = -1  # the line a search or "first error" went to
        self.needle = ""  # the log search n/N step through
        self.before_search: Widget | None = None  # focused before "/": focus goes back there

    def compose(self) -> ComposeResult:
        yield Static("No run yet: launch one (2) or open one from History (6).", id="run-header",
                     classes="pane-status")
        yield Static("", id="jobs-progress", classes="hidden")
        yield FitTable(COLUMNS, id="jobs-table", cursor_type="row", zebra_stripes=True)
        with Vertical(id="log-box"):
            yield Label("log", id="log-title")
            yield Input(placeholder="search the log: enter finds it (then n/N: next/previous), esc clears",
                        id="log-search", classes="hidden", compact=True)
            yield LogView(id="job-log", max_lines=2000)

    def on_mount(self) -> None:
        self.run_id = self.adaflash.current_run_id
        monitor = self.adaflash.pane("monitor")
        if monitor is not None:  # mounted after the Monitor already showed some progress
            self.show_progress(monitor.model.run_id, monitor.progress_shown)

    # -- run selection ----------------------------------------------------------------------------
    def set_run(self, run_id: str | None) -> None:
        if run_id == self.run_id:
            return
        self.run_id = run_id
        self.state = None
        self.rows.clear()
        self.selected = None
        self._select_log(None)
        self.query_one("#jobs-table", FitTable).show([])
        self.show_progress(None, "")
        self.refresh_data()

    def show_progress(self, run_id: str | None, line: str) -> None:
        """The Monitor's progress line of the run shown here (prompts in flight, tokens, training step)."""
        progress = self.query_one("#jobs-progress", Static)
        shown = line if run_id == self.run_id else ""
        progress.update(shown)
        progress.set_class(not shown, "hidden")

    def _select_log(self, key: str | None) -> None:
        row = self.rows.get(key) if key else None
        path = row.job.get("log_path") if row else None
        self.selected = key
        if path != self.log_path:
            self.log_path, self.log_offset, self.log_line = path, 0, -1
            self.query_one("#job-log", LogView).clear()
            self._log_title(row)

    def _log_title(self, row: JobRow | None = None) -> None:
        row = row or (self.rows.get(self.selected) if self.selected else None)
        log = self.query_one("#job-log", LogView)
        path = row.job.get("log_path") if row else None
        title = f"log · {row.label}" if row and path else "log"
        title += "" if log.auto_scroll else "  [held: f follows]"
        title += "  [wrap]" if log.wrap else ""
        if self.needle:  # the marks before the path: a narrow terminal cuts the path, not them
            found = log.matches(self.needle)
            where = f"{found.index(self.log_line) + 1}/{len(found)}" if self.log_line in found else f"{len(found)}"
            title += f"  [/{self.needle}: {where} n/N]"
        title += f" · {self._short_path(path)}" if row and path else ""
        self.query_one("#log-title", Label).update(Text(title))
        log.border_title = Text(title)  # shown when full screen (Text: a search for "[x]" is no markup)

    def _short_path(self, path: str) -> str:
        """A log path as short as it stays clear: inside the workspace, relative to it."""
        try:
            return str(Path(path).relative_to(self.adaflash.workspace))
        except ValueError:
            return path

    # -- reading ------------------------------------------------------------------------------------
    def request(self) -> Any:
        return (self.run_id, self.log_path, self.log_offset)

    def read(self, request: Any) -> tuple[RunState, LogChunk | None]:
        run_id, path, offset = request
        state = self.adaflash.backend.run_state(run_id)
        chunk = self.adaflash.backend.read_log(path, offset) if path else None
        return state, chunk

    def apply(self, request: Any, result: tuple[RunState, LogChunk | None]) -> None:
        run_id, path, offset = request
        if run_id != self.run_id:
            return  # the run changed while reading
        state, chunk = result
        self.state = state
        self._header(state)
        self._table(state)
        if chunk is not None and path == self.log_path and offset == self.log_offset:
            log = self.query_one("#job-log", LogView)
            if chunk.reset:
                log.clear()
            if chunk.text:
                log.write(chunk.text)
            self.log_offset = chunk.offset
        if self.log_path is None and self.rows:
            table = self.query_one("#jobs-table", DataTable)
            if table.row_count:
                key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
                if key in self.rows and self.rows[key].job.get("log_path"):
                    self._select_log(key)
                    self._again = True

    def _header(self, state: RunState) -> None:
        header = self.query_one("#run-header", Static)
        run = state.run
        if run is None:
            header.update("No run yet: launch one (2) or open one from History (6)." if not self.run_id
                          else f"[red]run {self.run_id} is not in the run log[/red]")
            return
        text = Text.assemble(("run ", "dim"), (run["id"], "bold"), f"  {run.get('name') or run.get('kind')}  ",
                             status_text(run["status"]))
        if run["id"] in self.stopping and run["status"] in LIVE_RUN_STATUSES:
            text.append("  stopping: the step in flight finishes, a final version is published…", style="yellow")
        if run["status"] in ("pending", "running", "detached"):
            text.append("  supervisor " + (f"pid {run.get('pid')} alive" if state.supervisor_alive else "gone"),
                        style="green" if state.supervisor_alive else "bold red")
        if run.get("note"):  # whole (it may end with the failed job's log path): the header wraps
            note = run["note"].splitlines()[0].replace(f"{self.adaflash.workspace}/", "")  # paths as in the title
            text.append(f"  {note}", style="dim")
        header.update(text)

    def _table(self, state: RunState) -> None:
        table = self.query_one("#jobs-table", FitTable)
        rows: dict[str, JobRow] = {}
        if state.run is not None:
            for job in state.jobs:
                key = f"{state.run['id']}:{job['id']}"
                rows[key] = JobRow(key, state.run["id"], job["name"], job["name"], True, job)
            for child in state.children:
                for job in child.get("jobs", []):
                    key = f"{child['id']}:{job['id']}"
                    rows[key] = JobRow(key, child["id"], job["name"], f"{child['job']} › {job['name']}", False, job)
        now = time.time()
        shown = []
        for key, row in rows.items():
            job = row.job
            note = (job.get("message") or "").splitlines()[0][:60] if job.get("message") else ""
            url = job.get("url") if job.get("status") in ("ready", "running", "starting", "restarting") else None
            shown.append((key, {
                "job": Text(row.label, style="bold" if row.controllable else ""), "role": job.get("role") or "",
                "status": status_text(job.get("status")), "gpus": job.get("gpus") or "cpu",
                "url": Text(url or "", style="bold green" if job.get("status") == "ready" else "dim"),
                "pid": str(job.get("pid") or ""), "uptime": uptime(job, now), "restarts": str(job.get("restarts") or 0),
                "exit": "" if job.get("exit_code") is None else str(job["exit_code"]), "note": note,
            }))
        self.rows = rows
        table.show(shown)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id != "jobs-table" or event.row_key is None:
            return
        key = event.row_key.value
        if key != self.selected and key in self.rows:
            self._select_log(key)
            self.refresh_data()

    # -- actions ------------------------------------------------------------------------------------
    def _current(self) -> JobRow | None:
        table = self.query_one("#jobs-table", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self.rows.get(key)

    def action_stop_job(self) -> None:
        self._job_action("stop")

    def action_restart_job(self) -> None:
        self._job_action("restart")

    def _job_action(self, action: str) -> None:
        row = self._current()
        if row is None:
            self.app.notify("No job selected.", severity="warning")
            return
        if not row.controllable:
            self.app.notify(f"{row.label} belongs to a run its job {row.label.split(' › ')[0]} created: "
                            "stop or restart that job instead.", severity="warning")
            return
        if action == "stop" and not is_active(row.job):
            self.app.notify(f"Job {row.name} is {row.job.get('status')}: nothing to stop.", severity="warning")
            return
        run = self.state.run if self.state else None
        if action == "restart" and run is not None and run["status"] not in LIVE_RUN_STATUSES:
            # A restart is the run's supervisor's to do, and an ended run has none.
            self.app.notify(f"Run {run['id']} is {run['status']}: no supervisor is left to restart {row.name}. "
                            "Launch the run again (2, or `adaflash run` with its recipe: jobs it finished are "
                            "reused).", severity="warning", timeout=8)
            return
        verb = "Stop" if action == "stop" else "Restart"
        message = (f"{verb} job {row.name} of run {row.run_id}?\n"
                   f"(pid {row.job.get('pid') or '-'}, status {row.job.get('status')}; its process group gets "
                   f"SIGTERM, then SIGKILL after its grace period)")
        self.app.push_screen(ConfirmScreen(f"{verb} job {row.name}", message, verb),
                             lambda ok: ok and self._control(row.run_id, action, row.name))

    def action_stop_run(self) -> None:
        run = self.state.run if self.state else None
        if run is None:
            self.app.notify("No run to stop.", severity="warning")
            return
        if run["status"] not in LIVE_RUN_STATUSES:
            self.app.notify(f"Run {run['id']} is {run['status']}: nothing to stop.", severity="warning")
            return
        live = [j["name"] for j in (self.state.jobs if self.state else []) if is_active(j)]
        self.app.push_screen(
            ConfirmScreen("Stop the run", f"Stop run {run['id']} and its jobs ({', '.join(live) or 'none live'})?",
                          "Stop run"),
            lambda ok: ok and self._control(run["id"], "stop-run", None))

    def _control(self, run_id: str, action: str, job: str | None) -> None:
        if action == "stop-run":
            self.stopping.add(run_id)
            self.app.notify(f"Stopping run {run_id}: a pipeline finishes its step and publishes a final version "
                            "first (a CPU training step may take a minute)", timeout=8)
            self.refresh_data()
        else:
            self.app.notify(f"{action} {job or run_id}…", timeout=2)
        self.run_worker(lambda: self._control_work(run_id, action, job), thread=True, group="jobs-control",
                        name=f"{action} {job or run_id}", exit_on_error=False)

    def _control_work(self, run_id: str, action: str, job: str | None) -> None:
        try:
            done = self.adaflash.backend.job_action(run_id, action, job)
        except Exception as err:  # noqa: BLE001 - shown, never a crash
            self.post_message(self.Controlled(self, f"{action} failed: {err}", run_id, error=True))
        else:
            self.post_message(self.Controlled(self, done, run_id))

    class Controlled(Message):
        """A stop/restart request came back (done, or why not)."""

        def __init__(self, pane: Pane, text: str, run_id: str, error: bool = False) -> None:
            super().__init__()
            self.pane, self.text, self.run_id, self.error = pane, text, run_id, error

    def on_jobs_pane_controlled(self, message: JobsPane.Controlled) -> None:
        message.stop()
        self.stopping.discard(message.run_id)
        self.app.notify(message.text, severity="error" if message.error else "information")
        self.refresh_data()

    def action_toggle_log(self) -> None:
        """The log pane is a few lines: show it full screen, or back."""
        log = self.query_one("#job-log", LogView)
        if self.screen.maximized is log:
            self.screen.minimize()
            self.query_one("#jobs-table").focus()
            return
        if self.screen.maximize(log, container=False):
            log.focus()
            log.scroll_end(animate=False)

    # -- the log: follow, wrap, search, first error ---------------------------------------------------
    def action_toggle_follow(self) -> None:
        log = self.query_one("#job-log", LogView)
        log.auto_scroll = not log.auto_scroll
        if log.auto_scroll:
            log.scroll_end(animate=False)
        self._log_title()

    def action_toggle_wrap(self) -> None:
        log = self.query_one("#job-log", LogView)
        log.set_wrap(not log.wrap)
        if log.auto_scroll:
            log.scroll_end(animate=False)
        self._log_title()

    def _show_line(self, index: int) -> None:
        """Hold the log at this line (following would pull it away at the next write)."""
        log = self.query_one("#job-log", LogView)
        log.auto_scroll = False
        self.log_line = index
        log.set_search(self.needle, index)
        log.show_line(index)
        self._log_title()

    def action_search_log(self) -> None:
        box = self.query_one("#log-search", Input)
        if not box.has_focus:
            self.before_search = self.app.focused
        box.value = self.needle
        box.remove_class("hidden")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "log-search":
            return
        event.stop()
        self.needle = event.value.strip()
        self._close_search()
        if self.needle:
            self._step(forward=True, start=self.log_line)
        else:
            self.query_one("#job-log", LogView).set_search("")
            self._log_title()

    def _close_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.add_class("hidden")
        back = self.before_search
        (back if back is not None and back.is_attached and back is not box else self.query_one("#jobs-table")).focus()

    def _step(self, forward: bool, start: int | None = None) -> None:
        if not self.needle:
            self.app.notify("No search yet: / searches the log.", severity="warning", timeout=3)
            return
        found = self.query_one("#job-log", LogView).matches(self.needle)
        line = first(found, self.log_line if start is None else start, forward)
        if line is None:
            self.query_one("#job-log", LogView).set_search(self.needle)
            self._log_title()
            self.app.notify(f"{self.needle!r} is not in the log shown.", severity="warning", timeout=3)
            return
        self._show_line(line)

    def action_next_match(self) -> None:
        self._step(forward=True)

    def action_previous_match(self) -> None:
        self._step(forward=False)

    def on_key(self, event: Any) -> None:
        box = self.query_one("#log-search", Input)
        if event.key == "escape" and box.has_focus:  # esc leaves the search and clears its highlights
            event.stop()
            box.value = ""
            self.needle = ""
            self.query_one("#job-log", LogView).set_search("")
            self._close_search()
            self._log_title()

    def action_first_error(self) -> None:
        lines = self.query_one("#job-log", LogView).lines
        found = next((i for i, line in enumerate(lines) if ERROR_LINE.search(line)), None)
        if found is None:
            self.app.notify("No error in the log shown.", timeout=3)
            return
        self._show_line(found)

    def focus_primary(self) -> None:
        self.query_one("#jobs-table").focus()
