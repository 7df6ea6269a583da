"""GPUs: one card per GPU (utilization and memory with history, temperature, power, processes
mapped to adaflash jobs) and the host's CPU/RAM; on a machine without GPUs, says so and offers
CPU workers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Static

from tui.actions import bindings_for
from tui.panes.base import Pane
from tui.widgets import GpuCard, History, HostCard

if TYPE_CHECKING:
    from jobs.gpus import Snapshot


class GpusPane(Pane):
    SCOPE = "gpus"
    INTERVAL = 1.5
    BINDINGS = bindings_for("gpus")

    class SnapshotTaken(Message):
        """A new inventory snapshot: the Launch pane offers its GPUs and checks against it."""

        def __init__(self, snapshot: Snapshot) -> None:
            super().__init__()
            self.snapshot = snapshot

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = History()
        self.snapshot: Snapshot | None = None
        self._rebuilding = False

    def compose(self) -> ComposeResult:
        yield Static("reading GPUs…", id="gpu-summary", classes="pane-status")
        with Horizontal(id="no-gpu", classes="hidden"):
            yield Static("", id="no-gpu-text")
            yield Button("Use CPU workers (c)", id="use-cpu", variant="primary", compact=True)
        with VerticalScroll(id="gpu-cards", can_focus=True):
            yield HostCard()

    def request(self) -> Any:
        return True

    def read(self, request: Any) -> Snapshot:
        return self.adaflash.backend.snapshot()

    def apply(self, request: Any, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        summary = self.query_one("#gpu-summary", Static)
        no_gpu = self.query_one("#no-gpu")
        if snapshot.available:
            used = sum(1 for g in snapshot.gpus if g.processes)
            driver = f"driver {snapshot.driver_version or 'N/A'} · CUDA {snapshot.cuda_driver_version or 'N/A'}"
            summary.update(f"[b]{len(snapshot.gpus)} GPU(s)[/b] · {used} busy · {driver}")
            no_gpu.add_class("hidden")
        else:
            summary.update("[b]No GPU[/b] · host only")
            self.query_one("#no-gpu-text", Static).update(
                f"[b yellow]No usable NVIDIA GPU[/b yellow]: {snapshot.reason or 'unknown reason'}.\n"
                "adaflash runs everything on CPU workers here (smollm2-135m end to end).")
            no_gpu.remove_class("hidden")
        cards = self.query_one("#gpu-cards", VerticalScroll)
        present = {card.index: card for card in cards.query(GpuCard)}
        wanted = [g.index for g in snapshot.gpus]
        if self._rebuilding:
            pass  # the new cards are being mounted; the next snapshot fills them
        elif sorted(present) != sorted(wanted):
            self._rebuilding = True
            self.call_later(self._rebuild, list(present.values()), wanted, snapshot)
        else:
            self._update_cards(snapshot)
        self.query_one(HostCard).update_info(snapshot.host, self.history)
        self.post_message(self.SnapshotTaken(snapshot))

    async def _rebuild(self, old: list[GpuCard], wanted: list[int], snapshot: Snapshot) -> None:
        """The set of GPUs changed (first snapshot, or a device appeared/vanished): new cards."""
        cards = self.query_one("#gpu-cards", VerticalScroll)
        await cards.remove_children(old)
        await cards.mount_all([GpuCard(i) for i in wanted], before=0)
        self._rebuilding = False
        self._update_cards(snapshot)

    def _update_cards(self, snapshot: Snapshot) -> None:
        by_index = {card.index: card for card in self.query(GpuCard)}
        for gpu in snapshot.gpus:
            card = by_index.get(gpu.index)
            if card is not None and card.is_mounted:
                card.update_info(gpu, self.history)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "use-cpu":
            event.stop()
            self.action_use_cpu()

    def action_use_cpu(self) -> None:
        self.adaflash.use_cpu_workers()

    def focus_primary(self) -> None:
        self.query_one("#gpu-cards").focus()
