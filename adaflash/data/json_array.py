"""Decode a top-level JSON array element by element, stopping cleanly where the file is cut off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from adaflash.data.errors import DatasetError


class JsonArrayReader:
    """Decode a top-level JSON array element by element.

    Why: ShareGPT's file is a huge array cut off mid-element. Reading it whole fails; decoding
    each element with `raw_decode` over a sliding buffer yields every complete element and stops
    cleanly at the cut (`truncated` is then set). A malformed element elsewhere is an error with
    its line. Memory stays at about one chunk plus the largest element.
    """

    def __init__(self, handle: IO[str], path: Path, chunk_size: int = 1 << 20) -> None:
        self.handle = handle
        self.path = path
        self.chunk_size = chunk_size
        self.truncated = False
        self.truncated_line: int | None = None
        self._buf = ""
        self._pos = 0
        self._mark = 0  # a place in self._buf whose line is known: lines are counted on from there, never
        self._mark_line = 1  # again from the buffer's start (that made reading a 1 MB chunk quadratic)
        self._eof = False

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = self.handle.read(self.chunk_size)
        self._mark_line = self._line_at(self._pos)
        self._buf = self._buf[self._pos:] + chunk
        self._pos = self._mark = 0
        if not chunk:
            self._eof = True
        return bool(chunk)

    def _line_at(self, pos: int) -> int:
        if pos < self._mark:
            return self._mark_line - self._buf.count("\n", pos, self._mark)
        self._mark_line += self._buf.count("\n", self._mark, pos)
        self._mark = pos
        return self._mark_line

    def _peek(self) -> str | None:
        """The next non-space character (not consumed), or None at the end of the file."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in " \t\r\n":
                self._pos += 1
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return None

    def _error(self, pos: int, message: str) -> DatasetError:
        return DatasetError(f"{self.path}:{self._line_at(pos)}: {message}")

    def _truncate(self) -> None:
        self.truncated = True
        self.truncated_line = self._line_at(self._pos)

    def _open_array(self) -> bool:
        """Consume the opening '['; False when the array is empty."""
        first = self._peek()
        if first is None:
            raise DatasetError(f"{self.path}: empty file; expected a JSON array")
        if first != "[":
            raise self._error(self._pos, "expected a JSON array of objects ('[' first)")
        self._pos += 1
        return self._peek() != "]"

    def _decode_element(self, decoder: json.JSONDecoder) -> tuple[Any, int] | None:
        """The element at the cursor and where it ends, reading chunks until it is whole.

        None when the file ends inside it (the cut of a truncated file).
        """
        while True:
            try:
                value, end = decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as err:
                if self._fill():
                    continue
                if err.msg.startswith("Unterminated string") or err.pos >= len(self._buf.rstrip()):
                    self._truncate()
                    return None
                raise self._error(err.pos, f"not valid JSON ({err.msg})") from None
            if (end >= len(self._buf) or self._buf[end] not in ",] \t\r\n") and self._fill():
                continue  # a number cut by the chunk ("2." of "2.5") goes on in the next one
            return value, end

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        decoder = json.JSONDecoder()
        if not self._open_array():
            return
        index = 0
        while True:
            if self._peek() is None:
                self._truncate()
                return
            decoded = self._decode_element(decoder)
            if decoded is None:
                return
            value, end = decoded
            where = f"{self.path}:{self._line_at(self._pos)}"
            self._pos = end
            yield where, value
            index += 1
            nxt = self._peek()
            if nxt is None:
                self._truncate()
                return
            if nxt == "]":
                return
            if nxt != ",":
                raise self._error(self._pos, f"expected ',' or ']' after element {index}, got {nxt!r}")
            self._pos += 1
