"""The polling pattern every pane shares.

A pane reads in a thread worker and never touches a widget from there: the worker posts
`Pane.Read` (or `Pane.Failed`), and the handler, on the UI thread, owns all state. Reads never
overlap: a tick while one is in flight only asks for another once it lands (`_again`), so a
slow disk or a busy run log cannot pile up threads or reorder results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static

if TYPE_CHECKING:
    from tui.app import AdaflashApp


class Pane(Vertical):
    """A tab's content with a non-overlapping background read."""

    SCOPE = ""
    INTERVAL: float | None = 1.0  # seconds between reads while live; None: on demand only
    VISIBLE_ONLY = False  # poll only while the tab is shown (it refreshes when shown anyway)

    class Read(Message):
        def __init__(self, pane: Pane, request: Any, result: Any) -> None:
            super().__init__()
            self.pane, self.request, self.result = pane, request, result

    class Failed(Message):
        def __init__(self, pane: Pane, request: Any, error: BaseException) -> None:
            super().__init__()
            self.pane, self.request, self.error = pane, request, error

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._busy = False
        self._again = False

    @property
    def busy(self) -> bool:
        """A read is in flight, or its result has not been applied yet (or one more is due)."""
        return self._busy or self._again

    @property
    def adaflash(self) -> AdaflashApp:
        return self.app  # type: ignore[return-value]

    def on_mount(self) -> None:
        """Register, start polling, read once. Textual runs this after a subclass's own on_mount
        (handlers of every class in the MRO run), so subclasses never call super() for it."""
        self.adaflash.register_pane(self)
        interval = self.INTERVAL
        if interval and self.adaflash.live:
            self.set_interval(interval * self.adaflash.interval_scale, self._poll, name=f"{self.SCOPE}-poll")
        self.call_after_refresh(self.tick)

    # -- the read cycle -----------------------------------------------------------------------------
    def request(self) -> Any:
        """What the next read needs (copied state), or None when there is nothing to read."""
        return None

    def read(self, request: Any) -> Any:
        """Blocking: runs in a thread worker. Return plain data; never touch widgets."""
        raise NotImplementedError

    def apply(self, request: Any, result: Any) -> None:
        """On the UI thread: fold the result into the pane's state and widgets."""

    def failed(self, request: Any, error: BaseException) -> None:
        self.set_status(f"[red]read failed: {error}[/red]")

    def _poll(self) -> None:
        if not self.VISIBLE_ONLY or self.adaflash.active_tab == self.SCOPE:
            self.tick()

    def tick(self) -> None:
        """Start a read unless one is in flight (then one more follows it)."""
        if self._busy:
            self._again = True
            return
        request = self.request()
        if request is None:
            return
        self._busy = True
        self.run_worker(lambda: self._work(request), thread=True, exclusive=True, group=f"{self.SCOPE}-read",
                        name=f"{self.SCOPE} read", exit_on_error=False)

    def refresh_data(self) -> None:
        self.tick()

    def _work(self, request: Any) -> None:
        try:
            result = self.read(request)
        except Exception as err:  # noqa: BLE001 - shown inline, never a crash
            self.post_message(self.Failed(self, request, err))
        else:
            self.post_message(self.Read(self, request, result))

    def on_pane_read(self, message: Pane.Read) -> None:
        if message.pane is not self:
            return
        message.stop()
        self._busy = False
        try:
            self.apply(message.request, message.result)
        except Exception as err:  # noqa: BLE001 - a dashboard that crashes helps nobody: say it, go on
            self.log.error(f"{self.SCOPE}: applying a read failed", err)
            self.app.notify(f"{self.SCOPE}: {type(err).__name__}: {err}", severity="error", timeout=8)
        self._continue()

    def on_pane_failed(self, message: Pane.Failed) -> None:
        if message.pane is not self:
            return
        message.stop()
        self._busy = False
        self.failed(message.request, message.error)
        self._continue()

    def _continue(self) -> None:
        if self._again:
            self._again = False
            self.tick()

    # -- helpers ------------------------------------------------------------------------------------
    def set_status(self, markup: str) -> None:
        for status in self.query(".pane-status").results(Static):
            status.update(markup)

    def focus_primary(self) -> None:
        """Focus the widget the pane's keys are meant for."""

    def on_show_pane(self) -> None:
        """The tab became visible."""
