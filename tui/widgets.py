"""Small widgets of the panes: the GPU-to-role grid, a GPU card, a speed-up bar chart."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Click
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Checkbox, DataTable, Label, RadioButton, SelectionList, Static
from textual.widgets._toggle_button import ToggleButton

if TYPE_CHECKING:
    from jobs.gpus import GpuInfo, HostInfo

CPU = "cpu"
HISTORY = 120  # samples of GPU history kept for the sparklines


def bar(percent: float | None, width: int = 12) -> Text:
    """A horizontal gauge; N/A when the value is missing."""
    if percent is None:
        return Text("N/A".ljust(width), style="dim")
    percent = max(0.0, min(100.0, percent))
    filled = round(percent / 100 * width)
    style = "green" if percent < 60 else "yellow" if percent < 85 else "red"
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim")


class Table(DataTable):
    """A DataTable with the keys of a list: j/k move the cursor, Home/End go to the first/last row."""

    BINDINGS = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("home", "scroll_top", "First row", show=False),
        Binding("end", "scroll_bottom", "Last row", show=False),
    ]


@dataclass(frozen=True)
class Col:
    """A column of a FitTable: `priority` 0 is always shown; higher numbers are left out first."""

    key: str
    title: str
    priority: int = 0
    hide_empty: bool = False  # left out while no row has a value in it


def cell_width(value: Any) -> int:
    return value.cell_len if isinstance(value, Text) else cell_len(str(value))


class FitTable(Table):
    """A table that shows whole columns only: what does not fit the width is left out, least important
    first, and comes back when the terminal grows (a column cut at the edge read `2026-` for a date).
    Rows are given whole (`show`); a redraw keeps the cursor on the same row key."""

    def __init__(self, columns: list[Col], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.specs = list(columns)
        self.data: list[tuple[str, dict[str, Any]]] = []
        self.shown_keys: list[str] = []
        self._fitted_width = -1

    def show(self, rows: list[tuple[str, dict[str, Any]]]) -> None:
        """Show these rows, (key, cells by column key); cells in place when the row keys and columns stay."""
        previous = [key for key, _ in self.data]
        self.data = rows
        visible = self.fit()
        if visible == self.shown_keys and previous == [key for key, _ in rows] and self.row_count == len(rows):
            for key, cells in rows:
                for column in visible:
                    self.update_cell(key, column, cells.get(column, ""), update_width=True)
            return
        self._redraw(visible)

    def fit(self) -> list[str]:
        """Keys of the columns that fit whole in the width, in display order."""
        width = self.size.width
        if width <= 0:
            return [c.key for c in self.specs]
        if len(self.data) + 1 > self.size.height:
            width -= self.styles.scrollbar_size_vertical
        need = {c.key: 2 * self.cell_padding + max([cell_width(c.title)] + [cell_width(cells.get(c.key, ""))
                                                                             for _, cells in self.data])
                for c in self.specs}
        empty = {c.key for c in self.specs if c.hide_empty and not any(cell_width(cells.get(c.key, ""))
                                                                         for _, cells in self.data)}
        keep = {c.key for c in self.specs if c.priority == 0}
        used = sum(need[k] for k in keep)
        for column in sorted((c for c in self.specs if c.priority and c.key not in empty), key=lambda c: c.priority):
            if used + need[column.key] <= width:
                keep.add(column.key)
                used += need[column.key]
        return [c.key for c in self.specs if c.key in keep]

    def _redraw(self, visible: list[str]) -> None:
        cursor_key = None
        if self.row_count and self.cursor_coordinate.row < self.row_count:
            cursor_key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        self.clear(columns=True)
        self.shown_keys = visible
        titles = {c.key: c.title for c in self.specs}
        for key in visible:
            self.add_column(titles[key], key=key)
        for key, cells in self.data:
            self.add_row(*(cells.get(column, "") for column in visible), key=key)
        keys = [key for key, _ in self.data]
        if cursor_key in keys:
            self.move_cursor(row=keys.index(cursor_key), animate=False)

    def on_resize(self) -> None:
        if self.size.width != self._fitted_width:
            self._fitted_width = self.size.width
            visible = self.fit()
            if visible != self.shown_keys:
                self._redraw(visible)


# -- the assignment grid ---------------------------------------------------------------------------


class AssignGrid(DataTable):
    """Roles (rows) × GPUs and cpu (columns): space/enter or a click toggles a cell."""

    BINDINGS = [Binding("space,enter", "toggle", "Toggle", show=False)]

    class Toggled(Message):
        def __init__(self, grid: AssignGrid, role: str, choice: str) -> None:
            super().__init__()
            self.grid = grid
            self.role = role
            self.choice = choice

        @property
        def control(self) -> AssignGrid:
            return self.grid

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="cell", zebra_stripes=False, show_row_labels=False, **kwargs)
        self._roles: list[str] = []
        self._choices: list[str] = []
        self._signature: tuple = ()

    def show(self, roles: list[str], choices: list[str], assign: dict[str, tuple[int, ...] | None],
             used: set[str], unknown: set[int]) -> None:
        """Redraw for this state (only when it changed); the cursor stays where it was."""
        signature = (tuple(roles), tuple(choices), tuple(sorted((r, assign.get(r, ())) for r in roles)),
                     tuple(sorted(used)), tuple(sorted(unknown)))
        if signature == self._signature:
            return
        self._signature = signature
        cursor = self.cursor_coordinate
        self.clear(columns=True)
        self._roles, self._choices = list(roles), list(choices)
        self.add_column("role", key="role")
        for choice in choices:
            if choice == CPU:
                label = Text("cpu")
            else:
                label = Text(f"GPU {choice}" + ("?" if int(choice) in unknown else ""),
                             style="bold red" if int(choice) in unknown else "")
            self.add_column(label, key=choice)
        for role in roles:
            gpus = assign.get(role, ())
            active = role in used
            cells: list[Any] = [Text(role if active else f"{role} (idle)", style="bold" if active else "dim")]
            for choice in choices:
                on = gpus is None if choice == CPU else (gpus is not None and int(choice) in gpus)
                mark = " ● " if on else " · "
                style = ("bold green" if active else "green") if on else "dim"
                cells.append(Text(mark, style=style))
            self.add_row(*cells, key=role)
        if self.row_count:
            self.cursor_coordinate = cursor if cursor.row < self.row_count and cursor.column < len(
                self.columns) else self.cursor_coordinate
            if self.cursor_coordinate.column == 0 and len(self.columns) > 1:
                self.cursor_coordinate = self.cursor_coordinate.right()

    def _cell(self, row: int, column: int) -> tuple[str, str] | None:
        if 0 <= row < len(self._roles) and 1 <= column <= len(self._choices):
            return self._roles[row], self._choices[column - 1]
        return None

    def action_toggle(self) -> None:
        cell = self._cell(self.cursor_coordinate.row, self.cursor_coordinate.column)
        if cell:
            self.post_message(self.Toggled(self, *cell))

    def on_click(self, event: Click) -> None:
        meta = event.style.meta
        if "row" in meta and "column" in meta:
            cell = self._cell(meta["row"], meta["column"])
            if cell:
                self.post_message(self.Toggled(self, *cell))


# -- GPU cards ----------------------------------------------------------------------------------------


class History:
    """Bounded per-device history (nvitop keeps one per metric too)."""

    def __init__(self) -> None:
        self.series: dict[str, deque] = {}

    def add(self, key: str, value: float | None) -> list[float]:
        values = self.series.setdefault(key, deque(maxlen=HISTORY))
        values.append(0.0 if value is None else float(value))
        return list(values)


class PercentSpark(Widget):
    """History of a percentage on a fixed 0-100 scale (a flat 5% stays low, unlike an autoscaled line)."""

    DEFAULT_CSS = "PercentSpark { height: 1; }"
    BLOCKS = " ▁▂▃▄▅▆▇█"
    data: reactive[list[float]] = reactive(list, always_update=True)

    def render(self) -> Text:
        width = max(1, self.size.width)
        values = self.data[-width:]
        out = Text(" " * (width - len(values)))
        for value in values:
            value = max(0.0, min(100.0, value))
            style = "green" if value < 60 else "yellow" if value < 85 else "red"
            level = round(value / 100 * (len(self.BLOCKS) - 1))
            out.append(self.BLOCKS[max(level, 1 if value > 0 else 0)], style=style)
        return out


class Gauge(Horizontal):
    """label, gauge, value text and the recent history (newest on the right)."""

    def __init__(self, label: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._label = label

    def compose(self) -> ComposeResult:
        yield Label(self._label, classes="gauge-label")
        yield Static("", classes="gauge-value")
        yield PercentSpark(classes="gauge-spark")

    def update(self, percent: float | None, text: str, history: list[float]) -> None:
        self.query_one(".gauge-value", Static).update(bar(percent, 10) + Text(f" {text}"))
        self.query_one(PercentSpark).data = history


class GpuCard(Vertical):
    """One GPU: name, temperature, power, utilization and memory with history, its processes."""

    def __init__(self, index: int, **kwargs: Any) -> None:
        super().__init__(id=f"gpu-{index}", classes="card", **kwargs)
        self.index = index

    def compose(self) -> ComposeResult:
        yield Static("", classes="card-title")
        yield Gauge("util", classes="gauge util")
        yield Gauge("mem ", classes="gauge mem")
        yield Static("", classes="card-procs")

    def update_info(self, gpu: GpuInfo, history: History) -> None:
        from jobs.gpus import fmt_bytes, fmt_num  # here: a first paint without the inventory's imports

        power = fmt_num(gpu.power, " W")
        if gpu.power_limit is not None:
            power += f"/{gpu.power_limit:.0f} W"
        title = Text.assemble((f"GPU {gpu.index}", "bold"), f" {gpu.name or 'N/A'}  ",
                              (fmt_num(gpu.temperature, "°C"), "cyan"), "  ", (power, "magenta"))
        self.query_one(".card-title", Static).update(title)
        util = history.add(f"{gpu.index}.util", gpu.utilization)
        mem = history.add(f"{gpu.index}.mem", gpu.memory_percent)
        self.query_one(".util", Gauge).update(gpu.utilization, fmt_num(gpu.utilization, "%"), util)
        self.query_one(".mem", Gauge).update(
            gpu.memory_percent, f"{fmt_bytes(gpu.memory_used)}/{fmt_bytes(gpu.memory_total)}", mem)
        lines = Text()
        if not gpu.processes:
            lines.append("no processes", style="dim")
        for i, proc in enumerate(gpu.processes):
            if i:
                lines.append("\n")
            lines.append(f"{proc.pid:>7} ", style="dim")
            lines.append(f"{(proc.name or 'N/A')[:16]:<16} {fmt_bytes(proc.used_memory):>9}")
            if proc.job:
                lines.append(f"  {proc.job.job}", style="bold green")
                lines.append(f" · {proc.job.run_id}", style="green")
        self.query_one(".card-procs", Static).update(lines)


class HostCard(Vertical):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(id="host-card", classes="card", **kwargs)

    def compose(self) -> ComposeResult:
        yield Static("", classes="card-title")
        yield Gauge("cpu ", classes="gauge cpu")
        yield Gauge("ram ", classes="gauge ram")

    def update_info(self, host: HostInfo, history: History) -> None:
        from jobs.gpus import fmt_bytes, fmt_num

        load = "N/A" if not host.load_average else " ".join(f"{v:.2f}" for v in host.load_average)
        self.query_one(".card-title", Static).update(Text.assemble(
            ("Host", "bold"), f"  {fmt_num(host.cpu_count)} CPUs  load {load}"))
        cpu = history.add("host.cpu", host.cpu_percent)
        ram = history.add("host.ram", host.memory_percent)
        self.query_one(".cpu", Gauge).update(host.cpu_percent, fmt_num(host.cpu_percent, "%"), cpu)
        self.query_one(".ram", Gauge).update(
            host.memory_percent, f"{fmt_bytes(host.memory_used)}/{fmt_bytes(host.memory_total)}", ram)


# -- bar chart --------------------------------------------------------------------------------------


class BarChart(Widget):
    """Horizontal bars (label, value): the speed-up of each compared row; 1.00x is marked."""

    data: reactive[list[tuple[str, float | None]]] = reactive(list, always_update=True)

    def __init__(self, title: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.title = title

    def render(self) -> Text:
        width = max(20, self.size.width)
        out = Text(self.title + "\n", style="bold") if self.title else Text()
        if not self.data:
            return out + Text("no speed-up to show (a Vanilla row of the same run is needed)", style="dim")
        label_w = min(max(len(label) for label, _ in self.data), max(12, width // 3))
        numbers = [v for _, v in self.data if v is not None]
        top = max(numbers + [1.0])
        room = max(5, width - label_w - 9)
        for i, (label, value) in enumerate(self.data):
            if i:
                out.append("\n")
            out.append(label[:label_w].ljust(label_w) + " ", style="bold" if value and value > 1 else "")
            if value is None:
                out.append("N/A", style="dim")
                continue
            cells = value / top * room
            full = int(cells)
            part = " ▏▎▍▌▋▊▉"[int((cells - full) * 8)]
            style = "green" if value > 1.0 else "yellow" if value == 1.0 else "red"
            out.append("█" * full + (part.strip() or ""), style=style)
            out.append(f" {value:.2f}x")
        return out


# -- toggles whose glyph says on or off (not only their colour) --------------------------------------


class Radio(RadioButton):
    """A radio button drawn ● when on and empty when off: the state reads without colour."""

    @property
    def BUTTON_INNER(self) -> str:  # noqa: N802 - textual reads this class constant per render
        return "●" if self.value else " "


class Check(Checkbox):
    """A checkbox drawn ✓ when on and empty when off."""

    @property
    def BUTTON_INNER(self) -> str:  # noqa: N802
        return "✓" if self.value else " "


class Checklist(SelectionList):
    """A selection list whose boxes are ✓ when selected and empty when not."""

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        segments = list(strip)
        if len(segments) > 2 and segments[1].text == ToggleButton.BUTTON_INNER and segments[1].style:
            index = (segments[1].style.meta or {}).get("option")
            if index is not None:
                on = self.get_option_at_index(index).value in self.selected
                segments[1] = Segment("✓" if on else " ", segments[1].style)
                return Strip(segments, strip.cell_length)
        return strip
