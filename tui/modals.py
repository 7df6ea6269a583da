"""Modal screens: confirmations, the quit question, and the help generated from the registry."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Label, Static

from tui.actions import help_rows


class ConfirmScreen(ModalScreen[bool]):
    """Yes/no before anything that stops or restarts a process."""

    BINDINGS = [Binding("escape,n", "dismiss(False)", "No"), Binding("y", "dismiss(True)", "Yes")]

    def __init__(self, title: str, message: str, yes: str = "Yes") -> None:
        super().__init__(classes="dialog-screen")
        self._title, self._message, self._yes = title, message, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._title, classes="dialog-title")
            yield Static(self._message, classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self._yes} (y)", variant="error", id="confirm-yes")
                yield Button("Cancel (n)", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")


class QuitScreen(ModalScreen[str | None]):
    """Runs are still going: stop them, or leave them running (they are detached)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("s", "dismiss('stop')", "Stop"),
                Binding("l", "dismiss('leave')", "Leave")]

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        super().__init__(classes="dialog-screen")
        self._runs = runs

    def compose(self) -> ComposeResult:
        names = "\n".join(f"  • {r['id']} ({r.get('name') or r.get('kind')}, {r.get('status')})" for r in self._runs)
        with Vertical(classes="dialog", id="quit-dialog"):
            yield Label("Jobs are still running", classes="dialog-title")
            yield Static(
                f"{names}\n\nLeave them running: they are detached, keep writing the run log, and show up "
                "again the next time adaflash-tui starts. Or stop them now.", classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Stop them (s)", variant="error", id="quit-stop")
                yield Button("Leave running (l)", variant="primary", id="quit-leave")
                yield Button("Cancel (esc)", id="quit-cancel")

    def on_mount(self) -> None:
        self.query_one("#quit-leave", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss({"quit-stop": "stop", "quit-leave": "leave"}.get(event.button.id or ""))


class HelpScreen(ModalScreen[None]):
    """Every key and action, generated from the same registry as the bindings and the palette."""

    BINDINGS = [Binding("escape,q,f1,question_mark", "dismiss", "Close")]

    def __init__(self) -> None:
        super().__init__(classes="dialog-screen")

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="help-dialog"):
            yield Label("adaflash-tui · keys and actions", classes="dialog-title")
            yield Static("Tabs: click them or press 1-6. Every action is also in the command palette (ctrl+p). "
                         "Esc closes.", classes="dialog-body")
            yield DataTable(id="help-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("where", "keys", "action")
        last = None
        for scope, keys, description, _ in help_rows():
            table.add_row(Text(scope if scope != last else "", style="bold"), Text(keys, style="bold cyan"),
                          description)
            last = scope
        table.focus()
