"""Collecting a recipe's mistakes: each one with the key as the user wrote it, its line, its origin.

Every check of a recipe reads values through a Checker and reports into it instead of raising,
so that a recipe with many mistakes lists them all at once (jobs.recipe raises at the end).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class Problem:
    """One mistake: `key` as written (`job[2].command`), and where it came from."""

    key: str
    message: str
    line: int | None = None
    origin: str | None = None  # "--set k=v" when an override put the value there

    def render(self, path: str) -> str:
        where = f"{path}:{self.line}" if self.line else path
        origin = f" (from {self.origin})" if self.origin else ""
        key = f"{self.key}: " if self.key else ""
        return f"{where}: {key}{self.message}{origin}"


def _nearest(table: Mapping[str, Any], key: str) -> Any:
    """The entry of `key` or of its closest dotted prefix (a.b.c, then a.b, then a); None if none."""
    parts = key.split(".")
    while parts:
        found = table.get(".".join(parts))
        if found:
            return found
        parts.pop()
    return None


def type_name(value: Any) -> str:
    """A value's type in TOML's words, for messages."""
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


def scalar_text(value: Any) -> str | None:
    """A string, number or boolean as the text it stands for (TOML spelling of booleans); else None."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return None


class Checker:
    """Reads typed values out of a recipe's tables and records a Problem for each mistake.

    `lines`: key path -> line (jobs.toml_lines.key_lines). `origins`: key path -> the `--set` that
    set it (a value from an override is reported with its origin instead of a line).
    """

    def __init__(self, lines: dict[str, int], origins: dict[str, str]) -> None:
        self.lines = lines
        self.origins = origins
        self.problems: list[Problem] = []
        self.aliases: dict[str, str] = {}  # normalized prefix (jobs.NAME) -> written prefix (job[2])

    def shown(self, key: str) -> str:
        for norm, written in self.aliases.items():
            if key == norm or key.startswith(norm + "."):
                return written + key[len(norm):]
        return key

    def line_of(self, key: str) -> int | None:
        return _nearest(self.lines, self.shown(key))

    def origin_of(self, key: str) -> str | None:
        return _nearest(self.origins, key)

    def add(self, key: str, message: str) -> None:
        origin = self.origin_of(key)
        self.problems.append(Problem(self.shown(key), message, None if origin else self.line_of(key), origin))

    def unknown_keys(self, table: Mapping[str, Any], allowed: Iterable[str], key: str) -> None:
        allowed = set(allowed)
        for name in table:
            if name not in allowed:
                where = f"{key}.{name}" if key else name
                self.add(where, f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def typed(self, table: Mapping[str, Any], name: str, key: str, kinds: tuple[type, ...], expected: str,
              *, required: bool = False) -> Any:
        """`table[name]` when it has one of `kinds` (a boolean is never a number); else None."""
        full = f"{key}.{name}" if key else name
        if name not in table:
            if required:
                self.add(full, f"required key missing (expected {expected})")
            return None
        value = table[name]
        if isinstance(value, bool) and bool not in kinds:
            self.add(full, f"expected {expected}, got {value!r} ({type_name(value)})")
            return None
        if not isinstance(value, kinds):
            self.add(full, f"expected {expected}, got {value!r} ({type_name(value)})")
            return None
        return value

    def choice(self, table: Mapping[str, Any], name: str, key: str, choices: tuple[str, ...],
               default: str) -> str:
        """A string that must be one of `choices`; `default` when absent or not a string."""
        value = self.typed(table, name, key, (str,), f"one of {', '.join(choices)}") or default
        if value not in choices:
            self.add(f"{key}.{name}", f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def table(self, data: Mapping[str, Any], name: str, *, required: bool = False) -> dict[str, Any]:
        value = self.typed(data, name, "", (dict,), "a table", required=required)
        return value or {}
