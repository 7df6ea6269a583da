"""History: past runs from the run log, filtered by method/target/dataset/status (and text); open
one (Jobs and Monitor follow it), select several and compare them, or launch one again (rerun as it
was, or loaded into the Launch form to edit first)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable, Input, Select, Static

from tui.actions import bindings_for
from tui.backend import RUN_FILTERS as FILTERS
from tui.backend import RunIndex
from tui.modals import ConfirmScreen
from tui.panes.base import Pane
from tui.panes.jobs import status_text
from tui.widgets import Col, FitTable

if TYPE_CHECKING:
    from jobs.rerun import Relaunch

# Status right after the id; a narrow terminal leaves out whole columns, the least telling first (the id
# already holds the kind and the date), and the line under the table tells all of the highlighted run.
COLUMNS = [Col("mark", " "), Col("id", "run"), Col("status", "status"), Col("kind", "kind", 7),
           Col("name", "name", 1), Col("method", "method", 2), Col("target", "target", 6),
           Col("dataset", "dataset", 3), Col("created", "created", 4), Col("duration", "duration", 5)]


def when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else ""


def duration(run: dict[str, Any]) -> str:
    start, end = run.get("created_at"), run.get("ended_at")
    if not start or not end:
        return ""
    seconds = max(0, int(end - start))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def short(value: Any, width: int = 24) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= width else "…" + text[-(width - 1):]


class HistoryPane(Pane):
    SCOPE = "history"
    INTERVAL = 3.0
    VISIBLE_ONLY = True
    BINDINGS = bindings_for("history")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filters: dict[str, str | None] = dict.fromkeys(FILTERS)
        self.text = ""
        self.runs: list[dict[str, Any]] = []
        self.total = 0  # runs matching the filters in the whole log (more than listed past the limit)
        self.shown: list[dict[str, Any]] = []
        self.selected: list[str] = []
        self.options: dict[str, tuple[str, ...]] = {}
        self._signature: tuple | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="history-filters"):
            for name in FILTERS:
                yield Select([], prompt=f"any {name}", id=f"f-{name}", compact=True)
            yield Input(placeholder="/ text", id="f-text", compact=True)
        yield FitTable(COLUMNS, id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="history-detail", classes="pane-status")

    # -- reading ------------------------------------------------------------------------------------
    def request(self) -> Any:
        return (*sorted(self.filters.items()), ("text", self.text.strip() or None))

    def read(self, request: Any) -> RunIndex:
        return self.adaflash.backend.run_index(**dict(request))

    def apply(self, request: Any, result: RunIndex) -> None:
        if request != self.request():
            self._again = True
            return
        runs, options = result.runs, result.options
        self.runs, self.total = runs, result.total
        for name, values in options.items():
            if values != self.options.get(name):
                select = self.query_one(f"#f-{name}", Select)
                current = self.filters[name]
                with select.prevent(Select.Changed):
                    select.set_options([(v, v) for v in values])
                    if current in values:
                        select.value = current
        self.options = options
        self.render_table()

    # -- view -----------------------------------------------------------------------------------------
    def render_table(self) -> None:
        text = self.text.lower()
        shown = [r for r in self.runs if not text or any(text in str(r.get(k) or "").lower() for k in
                                                          ("id", "name", "kind", "method", "target", "dataset",
                                                           "status", "note"))]
        signature = tuple((r["id"], r["status"], r.get("ended_at"), r["id"] in self.selected) for r in shown)
        if signature == self._signature:
            return
        self._signature = signature
        self.shown = shown
        table = self.query_one("#runs-table", FitTable)
        cursor = table.cursor_coordinate
        table.show([(run["id"], {
            "mark": Text("✓", style="bold green") if run["id"] in self.selected else Text(" "),
            "id": Text(run["id"], style="bold"), "status": status_text(run.get("status")), "kind": run.get("kind") or "",
            "name": short(run.get("name"), 20), "method": run.get("method") or "", "target": short(run.get("target")),
            "dataset": short(run.get("dataset")), "created": when(run.get("created_at")), "duration": duration(run),
        }) for run in shown])
        if table.row_count and table.cursor_coordinate.row != min(cursor.row, table.row_count - 1):
            table.move_cursor(row=min(cursor.row, table.row_count - 1), animate=False)
        self._detail()

    def _detail(self) -> None:
        detail = self.query_one("#history-detail", Static)
        run = self._current()
        total = f"{len(self.shown)} of {len(self.runs)} runs" if len(self.shown) != len(self.runs) else \
            f"{len(self.runs)} runs"
        if self.total > len(self.runs):
            total = f"{total} (the newest of {self.total:,}: filter or search to reach the others)"
        picked = f" · {len(self.selected)} selected (c compares them)" if self.selected else ""
        if run is None:
            detail.update(f"{total}{picked}" if self.runs else "No runs in this workspace yet.")
            return
        note = (run.get("note") or "").splitlines()[0] if run.get("note") else ""
        facts = [run.get("kind"), run.get("status"), run.get("method"), run.get("target"), run.get("dataset"),
                 f"created {when(run.get('created_at'))}", duration(run) and f"took {duration(run)}"]
        detail.update(Text.assemble((run["id"], "bold"), " · " + " · ".join(str(f) for f in facts if f),
                                    (f" · {note}" if note else "", "dim"), f"\n{total}{picked}"))

    def _current(self) -> dict[str, Any] | None:
        table = self.query_one("#runs-table", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r for r in self.shown if r["id"] == key), None)

    # -- events and actions -----------------------------------------------------------------------------
    def on_select_changed(self, event: Select.Changed) -> None:
        name = (event.select.id or "").removeprefix("f-")
        if name in self.filters:
            self.filters[name] = None if event.value is Select.NULL else str(event.value)
            self.refresh_data()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "f-text":
            self.text = event.value
            self.render_table()  # at once among the listed runs, then from the whole log
            self.refresh_data()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "f-text":
            self.query_one("#runs-table").focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "runs-table":
            self._detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "runs-table":
            self.action_open_run()

    def action_open_run(self) -> None:
        run = self._current()
        if run is None:
            return
        self.adaflash.open_run(run["id"])
        self.app.notify(f"Following run {run['id']}", timeout=2)

    def action_load_run(self) -> None:
        """A past run back into the Launch form (a recipe run as its recipe; a pipeline, server or benchmark as
        the form's fields), to edit, check and launch again."""
        self._relaunch("load")

    def action_rerun(self) -> None:
        """The highlighted run launched again as it was (a new run), after a confirmation."""
        self._relaunch("rerun")

    def _relaunch(self, what: str) -> None:
        run = self._current()
        if run is None:
            self.app.notify("No run selected.", severity="warning")
            return
        self.run_worker(lambda: self._relaunch_work(run["id"], what), thread=True, group="history-relaunch",
                        name=f"{what} {run['id']}", exit_on_error=False)

    def _relaunch_work(self, run_id: str, what: str) -> None:
        try:
            relaunch = self.adaflash.backend.relaunch(run_id)
        except Exception as err:  # noqa: BLE001 - NotRelaunchable, KeyError, OSError: said, never a crash
            self.post_message(self.Relaunched(what, None, str(err)))
        else:
            self.post_message(self.Relaunched(what, relaunch))

    class Relaunched(Message):
        """What a past run's record says about launching it again (or why it cannot be)."""

        def __init__(self, what: str, relaunch: Relaunch | None, error: str | None = None) -> None:
            super().__init__()
            self.what, self.relaunch, self.error = what, relaunch, error

    def on_history_pane_relaunched(self, message: HistoryPane.Relaunched) -> None:
        message.stop()
        relaunch = message.relaunch
        if relaunch is None:
            self.app.notify(f"Cannot {'load' if message.what == 'load' else 'rerun'}: {message.error}",
                            severity="warning", timeout=8)
            return
        if message.what == "load":
            self.adaflash.load_relaunch(relaunch)
            return
        self.app.push_screen(ConfirmScreen("Run it again", f"Launch run {relaunch.run_id} again, as a new run?\n"
                                           f"{relaunch.describe()}", "Rerun"),
                             lambda ok: ok and self._rerun(relaunch))

    def _rerun(self, relaunch: Relaunch) -> None:
        self.app.notify(f"Launching run {relaunch.run_id} again…", timeout=3)
        snapshot = self.adaflash.snapshot
        self.run_worker(lambda: self._rerun_work(relaunch, snapshot), thread=True, group="history-rerun",
                        name=f"rerun {relaunch.run_id}", exit_on_error=False)

    def _rerun_work(self, relaunch: Relaunch, snapshot: Any) -> None:
        try:
            run_id = self.adaflash.backend.rerun(relaunch, snapshot)
        except Exception as err:  # noqa: BLE001 - RecipeError, LeaseError, ValueError: said, never a crash
            self.post_message(self.Rerun(relaunch.run_id, None, str(err)))
        else:
            self.post_message(self.Rerun(relaunch.run_id, run_id))

    class Rerun(Message):
        def __init__(self, old: str, new: str | None, error: str | None = None) -> None:
            super().__init__()
            self.old, self.new, self.error = old, new, error

    def on_history_pane_rerun(self, message: HistoryPane.Rerun) -> None:
        message.stop()
        if message.new is None:
            self.app.notify(f"Rerun of {message.old} failed: {message.error}", severity="error", timeout=10)
            return
        self.adaflash.run_launched(message.new)
        self.refresh_data()

    def action_toggle_select(self) -> None:
        run = self._current()
        if run is None:
            return
        if run["id"] in self.selected:
            self.selected.remove(run["id"])
        else:
            self.selected.append(run["id"])
        self.render_table()
        table = self.query_one("#runs-table", DataTable)
        if table.cursor_coordinate.row < table.row_count - 1:
            table.move_cursor(row=table.cursor_coordinate.row + 1)

    def action_compare_selected(self) -> None:
        ids = list(self.selected)
        if not ids:
            run = self._current()
            ids = [run["id"]] if run else []
        if not ids:
            self.app.notify("No run to compare.", severity="warning")
            return
        self.adaflash.open_compare(ids)

    def action_focus_filter(self) -> None:
        self.query_one("#f-text").focus()

    def action_clear_filters(self) -> None:
        for name in FILTERS:
            select = self.query_one(f"#f-{name}", Select)
            with select.prevent(Select.Changed):
                select.clear()
            self.filters[name] = None
        self.query_one("#f-text", Input).value = ""
        self.text = ""
        self.selected.clear()
        self._signature = None
        self.refresh_data()
        self.query_one("#runs-table").focus()  # keys typed next are the table's, not the filter's

    def focus_primary(self) -> None:
        self.query_one("#runs-table").focus()
