"""Compare: the benchmark comparison table (method × dataset × concurrency; speed-up vs Vanilla,
τ, TTFT/ITL) with a bar chart of speed-up, sortable by any column, filterable, exportable."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from adaflash.bench import compare
from adaflash.methods import VANILLA
from tui.actions import bindings_for
from tui.backend import Comparison
from tui.monitor_model import fmt
from tui.panes.base import Pane
from tui.widgets import BarChart, Table

# Shown first, whatever the comparison's own order: what a row is (pinned while the table scrolls sideways)
# and what it measured; the other columns follow in the comparison's order.
KEY_COLUMNS = ("method", "dataset", "concurrency", "speedup", "accept_length", "output_throughput")
PINNED = 2  # method and dataset stay on screen when the cursor moves right

TEXT_KEYS = ("method", "target", "dataset", "label", "run_id", "group")


def matches(row: dict[str, Any], query: str) -> bool:
    """Every token must match: `key=value` (substring of that column) or text in a text column."""
    for token in query.split():
        key, sep, value = token.partition("=")
        if sep:
            if value.lower() not in str(row.get(key.strip(), "")).lower():
                return False
        elif not any(token.lower() in str(row.get(k) or "").lower() for k in TEXT_KEYS):
            return False
    return True


def sort_key(column: str):
    def key(row: dict[str, Any]) -> tuple:
        value = row.get(column)
        if value is None:
            return (1, 0, "")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (0, value, "")
        return (0, 0, str(value).lower())

    return key


class ComparePane(Pane):
    SCOPE = "compare"
    INTERVAL = 5.0
    VISIBLE_ONLY = True
    BINDINGS = bindings_for("compare")

    class Exported(Message):
        def __init__(self, path: Path | None, count: int, error: str | None = None) -> None:
            super().__init__()
            self.path, self.count, self.error = path, count, error

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_ids: list[str] | None = None
        self.data: Comparison | None = None
        self.sort_column: str | None = None
        self.reverse = False
        self.query_text = ""
        self.shown: list[dict[str, Any]] = []
        self.columns: list[str] = []
        self.last_export: Path | None = None
        self._signature: tuple = ()

    def compose(self) -> ComposeResult:
        with Horizontal(id="compare-bar"):
            box = Input(placeholder="/ filter: text or key=value", id="compare-filter", compact=True)
            box.tooltip = "Filter rows: words match method, dataset, target…; key=value matches one column " \
                          "(method=adaflash dataset=gsm8k). Esc clears."
            yield box
            yield Static("", id="compare-source", classes="pane-status")
        yield Table(id="compare-table", cursor_type="cell", zebra_stripes=True)
        with Horizontal(id="compare-bottom"):
            yield BarChart("speed-up vs Vanilla", id="speedup-chart")
            yield Static("", id="compare-notes")

    # -- data -----------------------------------------------------------------------------------------
    def set_runs(self, run_ids: list[str] | None) -> None:
        """Compare these runs (None: every result); a filter typed for the previous view is dropped."""
        self.run_ids = list(run_ids) if run_ids else None
        self.data = None
        self._clear_filter()
        self.refresh_data()

    def _clear_filter(self) -> None:
        box = self.query_one("#compare-filter", Input)
        if box.value:
            with box.prevent(Input.Changed):
                box.value = ""
        self.query_text = ""
        if box.has_focus:
            self.query_one("#compare-table").focus()

    def action_clear_filter(self) -> None:
        self._clear_filter()
        self.render_table()
        self.query_one("#compare-table").focus()

    def request(self) -> Any:
        return tuple(self.run_ids or ())

    def read(self, request: Any) -> Comparison:
        return self.adaflash.backend.comparison(list(request) or None)

    def apply(self, request: Any, data: Comparison) -> None:
        if tuple(self.run_ids or ()) != request:
            return
        signature = (tuple(r.get("result_id") for r in data.rows), tuple(str(s) for s in data.side_by_side))
        if self.data is not None and signature == self._signature:
            return  # nothing new: keep the cursor and the view as they are
        self._signature = signature
        self.data = data
        self.render_table()

    def failed(self, request: Any, error: BaseException) -> None:
        self.query_one("#compare-source", Static).update(f"[red]{error}[/red]")

    # -- view -----------------------------------------------------------------------------------------
    def visible_rows(self) -> list[dict[str, Any]]:
        rows = [r for r in (self.data.rows if self.data else []) if matches(r, self.query_text)]
        if self.sort_column:
            rows.sort(key=sort_key(self.sort_column), reverse=self.reverse)
            if self.reverse:  # missing values stay last either way
                rows.sort(key=lambda r: r.get(self.sort_column) is None)
        return rows

    def render_table(self) -> None:
        table = self.query_one("#compare-table", DataTable)
        source = self.query_one("#compare-source", Static)
        notes = self.query_one("#compare-notes", Static)
        chart = self.query_one(BarChart)
        cursor = table.cursor_coordinate
        table.clear(columns=True)
        data = self.data
        if data is None:
            return
        if not data.rows and data.side_by_side:
            self.shown = []
            self._side_by_side(table, data)
            source.update(f"{len(data.side_by_side)} run(s) without benchmark results: latest metrics side by side")
            chart.data = []
            notes.update("")
            return
        rows = self.visible_rows()
        self.shown = rows
        # Columns, their titles and widths from every row, not only those the filter keeps: filtered rows
        # may lack a column (its titles then fell out of step with the values), and the columns hold still
        # while a filter is typed (they shrank to `adafla` meanwhile).
        own = compare.columns_for(data.rows)
        every, own_titles = compare.display_rows(data.rows)
        title_of = dict(zip(own, own_titles))
        item_of = {id(row): item for row, item in zip(data.rows, every)}
        shown = [item_of[id(row)] for row in rows]
        self.columns = [c for c in KEY_COLUMNS if c in own] + [c for c in own if c not in KEY_COLUMNS]
        titles = [title_of[c] for c in self.columns]
        widths = {column: max([len(title_of[column])] + [len("N/A" if item[title_of[column]] is None
                                                               else str(item[title_of[column]])) for item in every])
                  for column in self.columns}
        table.fixed_columns = PINNED if self.columns[:PINNED] == list(KEY_COLUMNS[:PINNED]) else 0
        for column, title in zip(self.columns, titles):
            arrow = (" ▼" if self.reverse else " ▲") if column == self.sort_column else ""
            table.add_column(title + arrow, key=column, width=max(widths[column], len(title) + 2))
        for row, item in zip(rows, shown):
            cells = []
            for column, title in zip(self.columns, titles):
                value = item[title]
                text = Text("N/A", style="dim") if value is None else Text(str(value))
                if column == "speedup" and row.get("speedup") is not None:
                    text.stylize("bold green" if row["speedup"] > 1.0 else "yellow")
                if column in ("output_throughput", "speedup", "accept_length", "accept_rate", "accuracy", "n",
                              "concurrency") or column.endswith("_ms"):
                    text.justify = "right"
                cells.append(text)
            table.add_row(*cells, key=str(row.get("result_id")))
        if table.row_count:
            table.cursor_coordinate = table.validate_cursor_coordinate(cursor)
        total = len(data.rows)
        count = f"{len(rows)} of {total} rows" if len(rows) != total else f"{total} rows"
        source.update(f"{count} · {data.source}" if total else
                      "No benchmark results yet: run a benchmark matrix from Launch (2).")
        chart.data = [(f"{r['method']} · {r['dataset']} · c{r['concurrency']}", r.get("speedup")) for r in rows
                      if r.get("method") != VANILLA]
        notes.update(Text(compare.footer(data.warnings, rows), style="dim"))

    def _side_by_side(self, table: DataTable, data: Comparison) -> None:
        runs = data.side_by_side
        names = sorted({name for item in runs for name in item["metrics"]})
        table.fixed_columns = 1
        table.add_column("metric", key="metric")
        for item in runs:
            table.add_column(item["run"]["id"], key=item["run"]["id"])
        for name in names:
            table.add_row(name, *(fmt(item["metrics"].get(name)) for item in runs), key=name)

    # -- actions ------------------------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "compare-filter":
            self.query_text = event.value
            self.render_table()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "compare-filter":
            self.query_one("#compare-table").focus()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if event.data_table.id == "compare-table":
            self.sort_by(str(event.column_key.value))

    def sort_by(self, column: str) -> None:
        if column not in self.columns:
            return
        if self.sort_column == column:
            self.reverse = not self.reverse
        else:
            self.sort_column, self.reverse = column, column in ("speedup", "output_throughput", "accept_length")
        self.render_table()

    def action_sort(self) -> None:
        table = self.query_one("#compare-table", DataTable)
        if not table.columns:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).column_key if table.row_count else None
        if key is None:
            key = list(table.columns)[table.cursor_coordinate.column]
        self.sort_by(str(key.value))

    def action_focus_filter(self) -> None:
        self.query_one("#compare-filter").focus()

    def action_show_all(self) -> None:
        self.set_runs(None)

    def action_export(self, fmt_name: str) -> None:
        """Export what the table shows: benchmark rows, or the runs' metrics side by side."""
        backend, data = self.adaflash.backend, self.data
        if self.shown:
            rows, warnings = list(self.shown), list(data.warnings if data else [])
            job, count = partial(backend.export, rows, warnings, fmt_name), len(rows)
        elif data is not None and not data.rows and data.side_by_side:
            side = list(data.side_by_side)
            job = partial(backend.export_metrics, side, fmt_name)
            count = len({name for item in side for name in item["metrics"]})
        else:
            self.app.notify("Nothing to export: the table is empty.", severity="warning")
            return
        self.run_worker(lambda: self._export(job, count), thread=True, group="compare-export",
                        name=f"export {fmt_name}", exit_on_error=False)

    def _export(self, job: Callable[[], Path], count: int) -> None:
        try:
            path = job()
        except Exception as err:  # noqa: BLE001
            self.post_message(self.Exported(None, count, str(err)))
        else:
            self.post_message(self.Exported(path, count))

    def on_compare_pane_exported(self, message: ComparePane.Exported) -> None:
        message.stop()
        if message.path is None:
            self.app.notify(f"Export failed: {message.error}", severity="error")
            return
        self.last_export = message.path
        self.app.notify(f"Exported {message.count} rows to {message.path}")

    def focus_primary(self) -> None:
        self.query_one("#compare-table").focus()
