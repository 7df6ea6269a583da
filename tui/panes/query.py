"""Query, Harlequin-style: read-only SQL over the run log. The run log's views are the starting points
(pick one: its query lands in the editor and runs), errors show inline under the editor, and the
rows shown export to CSV or Markdown in the workspace's exports/ folder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, DataTable, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from tui.actions import bindings_for
from tui.panes.base import Pane

if TYPE_CHECKING:
    from tui.sqlquery import QueryResult, Source

FIRST_QUERY = "SELECT id, kind, status, method, target, dataset\nFROM runs\nORDER BY created_at DESC\nLIMIT 50"
CELL_WIDTH = 40  # a long note or config is cut in the table (the export keeps it whole)


def shown(value: Any) -> Text:
    if value is None:
        return Text("NULL", style="dim italic")
    if isinstance(value, float):
        return Text(f"{value:.6g}", justify="right")
    if isinstance(value, int):
        return Text(str(value), justify="right")
    text = str(value).replace("\n", " ")
    return Text(text if len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 1] + "…")


class QueryPane(Pane):
    SCOPE = "query"
    INTERVAL = None  # on demand: a query runs when asked
    BINDINGS = bindings_for("query")

    class Ran(Message):
        def __init__(self, result: QueryResult) -> None:
            super().__init__()
            self.result = result

    class Exported(Message):
        def __init__(self, path: str | None, error: str | None = None) -> None:
            super().__init__()
            self.path, self.error = path, error

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sources: list[Source] = []
        self.result: QueryResult | None = None
        self.running = False

    def compose(self) -> ComposeResult:
        with Horizontal(id="query-columns"):
            sources = OptionList(id="query-sources")
            sources.border_title = "views, tables"
            yield sources
            with Vertical(id="query-main"):
                editor = TextArea(FIRST_QUERY, language=None, id="query-editor", show_line_numbers=False,
                                  soft_wrap=True, tab_behavior="focus")
                editor.border_title = "SQL · read-only · f5 runs"
                yield editor
                with Horizontal(id="query-actions"):
                    yield Button("Run f5", id="query-run", variant="success", compact=True)
                    yield Button("CSV f6", id="query-csv", compact=True)
                    yield Button("MD f7", id="query-md", compact=True)
                    yield Static("", id="query-status", classes="pane-status")
                yield Static("", id="query-error", classes="hidden")
                yield DataTable(id="query-results", zebra_stripes=True, cursor_type="cell")

    # -- starting points (read once, in the base worker) -----------------------------------------------
    def request(self) -> Any:
        return "sources" if not self.sources else None

    def read(self, request: Any) -> list[Source]:
        return self.adaflash.backend.query_sources()

    def apply(self, request: Any, result: list[Source]) -> None:
        self.sources = result
        box = self.query_one("#query-sources", OptionList)
        box.clear_options()
        # Views (the ready-made questions) first and bold, then the tables, dim.
        box.add_options([Option(Text(s.name, style="bold" if s.kind == "view" else "dim"), id=s.name) for s in result])

    def failed(self, request: Any, error: BaseException) -> None:
        self._status(Text(f"cannot read the run log: {error}", style="bold red"))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        source = next((s for s in self.sources if s.name == event.option.id), None)
        if source is None:
            return
        self.query_one("#query-editor", TextArea).text = source.sql
        self.action_run_query()

    # -- running ---------------------------------------------------------------------------------------
    def action_run_query(self) -> None:
        if self.running:
            self.app.notify("A query is still running.", severity="warning", timeout=3)
            return
        sql = self.query_one("#query-editor", TextArea).text
        self.running = True
        self._status(Text("running…", style="yellow"))
        self.run_worker(lambda: self.post_message(self.Ran(self.adaflash.backend.query(sql))), thread=True,
                        group="query-run", name="query", exit_on_error=False)

    def on_query_pane_ran(self, message: QueryPane.Ran) -> None:
        message.stop()
        self.running = False
        result = message.result
        error = self.query_one("#query-error", Static)
        error.update(Text(f"✗ {result.error}", style="bold red") if result.error else "")
        error.set_class(not result.error, "hidden")
        if result.error:  # the last good rows stay; the error shows inline, under the editor
            self._status(Text("the query failed (below); the rows are the last good ones", style="red"))
            return
        self.result = result
        table = self.query_one("#query-results", DataTable)
        table.clear(columns=True)
        rows = [tuple(shown(v) for v in row) for row in result.rows]
        for i, name in enumerate(result.columns):  # explicit widths: auto widths lagged a redraw behind at times
            table.add_column(name, width=max([len(name), *(row[i].cell_len for row in rows)]))
        table.add_rows(rows)
        more = f" (the first {len(result.rows):,}: more match)" if result.truncated else ""
        self._status(Text.assemble((f"{len(result.rows):,} row(s){more}", "green"),
                                   (" · f6/f7 export them", "dim")))

    def _status(self, text: Text) -> None:
        self.query_one("#query-status", Static).update(text)

    # -- export ----------------------------------------------------------------------------------------
    def action_export(self, fmt: str) -> None:
        result = self.result
        if result is None:
            self.app.notify("Run a query first: its rows are what is exported.", severity="warning")
            return
        self.run_worker(lambda: self._export_work(result, fmt), thread=True, group="query-export",
                        name=f"export {fmt}", exit_on_error=False)

    def _export_work(self, result: QueryResult, fmt: str) -> None:
        try:
            path = self.adaflash.backend.export_query(result, fmt)
        except Exception as err:  # noqa: BLE001 - OSError: said, never a crash
            self.post_message(self.Exported(None, str(err)))
        else:
            self.post_message(self.Exported(str(path)))

    def on_query_pane_exported(self, message: QueryPane.Exported) -> None:
        message.stop()
        if message.path is None:
            self.app.notify(f"Export failed: {message.error}", severity="error")
            return
        self._status(Text(f"exported to {message.path}", style="green"))
        self.app.notify(f"Exported to {message.path}", timeout=8)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "query-run":
            self.action_run_query()
        elif event.button.id == "query-csv":
            self.action_export("csv")
        elif event.button.id == "query-md":
            self.action_export("markdown")

    def action_focus_editor(self) -> None:
        self.query_one("#query-editor").focus()

    def on_key(self, event: Any) -> None:
        if event.key == "escape" and self.query_one("#query-editor").has_focus:  # out of the editor: keys are keys
            event.stop()
            self.query_one("#query-sources").focus()

    def focus_primary(self) -> None:
        """The starting points, not the editor: a digit typed on arrival switches tabs, as everywhere."""
        self.query_one("#query-sources").focus()
