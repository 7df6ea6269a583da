"""Processes, nvitop-style: the current run's workers and servers with CPU %, RSS, GPU memory and
utilization, uptime and status; sortable (o cycles the column, O reverses), and a process's job
stopped from here through `jobs` after a confirmation, as the Jobs tab stops it.

psutil is read in the pane's thread worker (the sampler keeps its Process objects between reads, so
CPU % means something); the widget only folds the rows the worker posts."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Static

from jobs.gpus import fmt_bytes, fmt_num
from jobs.procstats import SORT_KEYS, ProcessSampler, ProcRow, sort_rows
from tui.actions import bindings_for
from tui.backend import is_active
from tui.modals import ConfirmScreen
from tui.panes.base import Pane
from tui.panes.jobs import status_text
from tui.widgets import Col, FitTable

TITLES = {"pid": "pid", "role": "role", "cpu": "CPU %", "rss": "RSS", "gpu_mem": "GPU mem", "gpu_util": "GPU %",
          "uptime": "uptime", "status": "status"}
# The narrow terminal keeps the job, its pid, CPU and memory and the status; then GPU, uptime and role.
COLUMNS = [Col("job", "job"), Col("pid", "pid"), Col("role", "role", 5), Col("cpu", "CPU %"), Col("rss", "RSS"),
           Col("gpu_mem", "GPU mem", 1), Col("gpu_util", "GPU %", 2), Col("uptime", "uptime", 3),
           Col("status", "status"), Col("procs", "procs", 4)]


def hms(seconds: float | None) -> str:
    if seconds is None:
        return "N/A"
    s = int(seconds)
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


def cells(row: ProcRow, now: float) -> dict[str, Any]:
    """A row as shown; every missing figure reads N/A (never a formatting error)."""
    return {
        "job": Text(row.label, style="bold" if row.controllable else ""), "pid": str(row.pid or "N/A"),
        "role": row.role, "cpu": fmt_num(row.cpu, digits=1), "rss": fmt_bytes(row.rss),
        "gpu_mem": fmt_bytes(row.gpu_mem), "gpu_util": fmt_num(row.gpu_util, "%"),
        "uptime": hms(row.uptime(now)), "status": status_text(row.status), "procs": str(row.processes or ""),
    }


class ProcsPane(Pane):
    SCOPE = "procs"
    INTERVAL = 2.0
    VISIBLE_ONLY = True  # psutil walks cost CPU: only while shown
    BINDINGS = bindings_for("procs")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sampler = ProcessSampler()
        self.rows: list[ProcRow] = []
        self.sort_key = "cpu"
        self.reverse = True

    def compose(self) -> ComposeResult:
        yield Static("No run yet: launch one (2) or open one from History (6).", id="procs-header",
                     classes="pane-status")
        yield FitTable(COLUMNS, id="procs-table", cursor_type="row", zebra_stripes=True)

    # -- reading (a thread worker: psutil never blocks the UI) -------------------------------------------
    def request(self) -> Any:
        run_id = self.adaflash.current_run_id
        return (run_id, self.adaflash.snapshot) if run_id else None

    def read(self, request: Any) -> list[ProcRow]:
        run_id, snapshot = request
        state = self.adaflash.backend.run_state(run_id, group="procs")
        if state.run is None:
            return []
        jobs = [(state.run["id"], job["name"], True, job) for job in state.jobs]
        jobs += [(child["id"], f"{child['job']} › {job['name']}", False, job)
                 for child in state.children for job in child.get("jobs", [])]
        gpu = [p for g in snapshot.gpus for p in g.processes] if snapshot is not None and snapshot.available else []
        return self.sampler.sample(jobs, gpu)

    def apply(self, request: Any, result: list[ProcRow]) -> None:
        if request[0] != self.adaflash.current_run_id:
            self._again = True
            return
        self.rows = result
        self.redraw()

    def redraw(self) -> None:
        now = time.time()
        shown = sort_rows(self.rows, self.sort_key, self.reverse, now)
        self.query_one("#procs-table", FitTable).show([(r.key, cells(r, now)) for r in shown])
        run_id = self.adaflash.current_run_id
        header = self.query_one("#procs-header", Static)
        if not run_id:
            header.update("No run yet: launch one (2) or open one from History (6).")
            return
        alive = sum(r.alive for r in self.rows)
        arrow = "▼" if self.reverse else "▲"
        snapshot = self.adaflash.snapshot
        gpu = f" · GPU: N/A ({snapshot.reason})" if snapshot is not None and not snapshot.available else ""
        header.update(Text.assemble(("run ", "dim"), (run_id, "bold"), f"  {alive} of {len(self.rows)} jobs running",
                                    (f"  sorted by {TITLES[self.sort_key]} {arrow} (o, O)", "dim"), (gpu, "dim")))

    def on_show_pane(self) -> None:
        self.refresh_data()

    # -- actions -------------------------------------------------------------------------------------
    def action_cycle_sort(self) -> None:
        self.sort_key = SORT_KEYS[(SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)]
        self.reverse = self.sort_key in ("cpu", "rss", "gpu_mem", "gpu_util", "uptime")  # the largest first
        self.redraw()

    def action_reverse_sort(self) -> None:
        self.reverse = not self.reverse
        self.redraw()

    def _current(self) -> ProcRow | None:
        table = self.query_one("#procs-table", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r for r in self.rows if r.key == key), None)

    def action_stop_process(self) -> None:
        row = self._current()
        if row is None:
            self.app.notify("No process selected.", severity="warning")
            return
        if not row.controllable:
            self.app.notify(f"{row.label} belongs to a run its job {row.label.split(' › ')[0]} created: stop that "
                            "job instead.", severity="warning")
            return
        if not row.alive or not is_active({"status": row.status}):
            self.app.notify(f"{row.label} is {row.status}: nothing to stop.", severity="warning")
            return
        message = (f"Stop job {row.job} of run {row.run_id}?\n(pid {row.pid}, {row.processes} process(es); its "
                   "process group gets SIGTERM, then SIGKILL after its grace period)")
        self.app.push_screen(ConfirmScreen(f"Stop {row.job}", message, "Stop"),
                             lambda ok: ok and self._stop(row))

    def _stop(self, row: ProcRow) -> None:
        self.app.notify(f"stop {row.job}…", timeout=2)
        self.run_worker(lambda: self._stop_work(row), thread=True, group="procs-control", name=f"stop {row.job}",
                        exit_on_error=False)

    def _stop_work(self, row: ProcRow) -> None:
        try:
            done = self.adaflash.backend.job_action(row.run_id, "stop", row.job)
        except Exception as err:  # noqa: BLE001 - shown, never a crash
            self.post_message(self.Stopped(f"stop failed: {err}", error=True))
        else:
            self.post_message(self.Stopped(done))

    class Stopped(Message):
        def __init__(self, text: str, error: bool = False) -> None:
            super().__init__()
            self.text, self.error = text, error

    def on_procs_pane_stopped(self, message: ProcsPane.Stopped) -> None:
        message.stop()
        self.app.notify(message.text, severity="error" if message.error else "information")
        self.refresh_data()

    def focus_primary(self) -> None:
        self.query_one("#procs-table").focus()
