"""The Jobs log, k9s-style: Textual's Log plus search highlights, an emphasised current match and
soft wrap. Wrapping maps screen rows to (line, first cell) so a 2000-line log re-wraps in a blink
on a resize, and search keeps working on whole lines whether the log wraps or not."""

from __future__ import annotations

import bisect
import re
from typing import Any

from rich.cells import cell_len
from rich.highlighter import Highlighter
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip
from textual.widgets import Log

MATCH = Style(color="black", bgcolor="#F2B84B")
CURRENT = Style(bold=True, underline=True)


class NeedleHighlighter(Highlighter):
    """Marks every occurrence of the searched text, case-insensitive."""

    def __init__(self, needle: str) -> None:
        self.pattern = re.compile(re.escape(needle), re.IGNORECASE) if needle else None

    def highlight(self, text: Text) -> None:
        if self.pattern is not None:
            for found in self.pattern.finditer(text.plain):
                text.stylize(MATCH, found.start(), found.end())


class LogView(Log):
    """A Log that highlights a search and wraps long lines on request."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wrap = False
        self.needle = ""
        self.current = -1  # the line of the current match (emphasised), -1: none
        self._rows: list[tuple[int, int]] = []  # wrapped: (line, first cell) of each screen row
        self._row_starts: list[int] = []  # wrapped: the first row of each line
        self._wrapped_width = 0

    # -- search ---------------------------------------------------------------------------------
    def set_search(self, needle: str, current: int = -1) -> None:
        self.needle, self.current = needle, current
        self.highlighter = NeedleHighlighter(needle)
        self.highlight = bool(needle)
        self._render_line_cache.clear()
        self.refresh()

    def matches(self, needle: str) -> list[int]:
        """Lines holding the text (case-insensitive), in order."""
        low = needle.lower()
        return [i for i, line in enumerate(self.lines) if low in line.lower()] if low else []

    def _render_line_strip(self, y: int, rich_style: Style) -> Strip:
        strip = super()._render_line_strip(y, rich_style)
        return strip.apply_style(CURRENT) if y == self.current and self.needle else strip

    # -- wrap -----------------------------------------------------------------------------------
    def set_wrap(self, wrap: bool) -> None:
        line = self.top_line()
        self.wrap = wrap
        if wrap:
            self._rewrap()
        else:
            self.virtual_size = Size(self._width, self.line_count)
        self.show_line(line, margin=0)
        self.refresh()

    def top_line(self) -> int:
        """The log line at the top of the view (kept in view when wrap toggles)."""
        y = int(self.scroll_y)
        if self.wrap and self._rows:
            return self._rows[min(y, len(self._rows) - 1)][0]
        return y

    def row_of(self, line: int) -> int:
        if not self.wrap or not self._row_starts:
            return line
        return self._row_starts[min(max(line, 0), len(self._row_starts) - 1)]

    def show_line(self, line: int, margin: int = 2) -> None:
        self.scroll_to(y=max(0, self.row_of(line) - margin), animate=False, immediate=True)

    def _rewrap(self) -> None:
        # The scrollbar's columns are always kept: it comes and goes with the rows, the width must not.
        width = max(1, self.size.width - self.styles.scrollbar_size_vertical)
        rows: list[tuple[int, int]] = []
        starts: list[int] = []
        for index in range(self.line_count):
            starts.append(len(rows))
            cells = cell_len(self._process_line(self._lines[index]))
            rows.extend((index, start) for start in range(0, max(cells, 1), width))
        self._rows, self._row_starts, self._wrapped_width = rows, starts, width
        self.virtual_size = Size(width, len(rows))

    def write(self, data: str, scroll_end: bool | None = None) -> LogView:
        super().write(data, scroll_end)
        if self.wrap:
            self._rewrap()
            if self.auto_scroll if scroll_end is None else scroll_end:
                self.scroll_end(animate=False, immediate=True, x_axis=False)
        return self

    def clear(self) -> LogView:
        super().clear()
        self._rows, self._row_starts = [], []
        self.current = -1
        return self

    def on_resize(self) -> None:
        if self.wrap and self.size.width - self.styles.scrollbar_size_vertical != self._wrapped_width:
            line = self.top_line()
            self._rewrap()
            self.show_line(line, margin=0)
        if self.auto_scroll:  # a following log stays at its end whatever its size (also at its first layout)
            self.scroll_end(animate=False, x_axis=False)

    def _render_line(self, y: int, scroll_x: int, width: int) -> Strip:
        if not self.wrap:
            return super()._render_line(y, scroll_x, width)
        rich_style = self.rich_style
        if y >= len(self._rows):
            return Strip.blank(width, rich_style)
        index, start = self._rows[y]
        strip = self._render_line_strip(index, rich_style)
        return strip.crop_extend(start, start + width, rich_style).apply_offsets(start, index)


def first(lines: list[int], after: int, forward: bool = True) -> int | None:
    """The next (or previous) of the sorted lines after (before) `after`, wrapping around."""
    if not lines:
        return None
    if forward:
        i = bisect.bisect_right(lines, after)
        return lines[i % len(lines)]
    i = bisect.bisect_left(lines, after) - 1
    return lines[i % len(lines)]
