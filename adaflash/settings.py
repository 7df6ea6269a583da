"""Typed settings groups: frozen dataclasses whose fields carry a `Rule` saying what they accept and, where
users may set them, their command-line flag and help.

A group is validated once, when it is built (from options, JSON or code), and names the field and what it
expected when a value is wrong; `dataclasses.asdict` of a group is what the run log records. The CLI
(`cli/groups.py`) makes every click option from these rules, so a flag has one declaration, one meaning and
one default (a command that needs another default names itself in the rule's `per_command`, which the help
states). No click here: workers and library code build the same groups.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar


class SettingError(ValueError):
    """A value a group refuses: `field` names it, and `{name}` in the message names another setting, so the
    library's words name fields and the CLI's name their flags (`render`)."""

    def __init__(self, group: str, field_name: str, message: str) -> None:
        self.group, self.field, self.message = group, field_name, message
        super().__init__(f"{group} setting {self.render(lambda name: name)}")

    def render(self, name_of: Any) -> str:
        """The error with every setting named by `name_of(field)`: its field name, or its flag."""
        try:
            message = self.message.format_map(_Names(name_of))
        except (ValueError, IndexError, AttributeError):  # a value's own braces: no names in it
            message = self.message
        return f"{name_of(self.field)} {message}"


class _Names(dict):
    def __init__(self, name_of: Any) -> None:
        super().__init__()
        self.name_of = name_of

    def __missing__(self, key: str) -> str:
        return str(self.name_of(key))


@dataclass(frozen=True)
class Rule:
    """What one setting accepts, and its option (`flag`, `help`, ...) where users may set it."""

    kind: type  # int, float, str or bool (a bool is never taken for an int, nor an int for a bool)
    optional: bool = False  # None is accepted: chosen later (by the engine, the command, the data)
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    choices: tuple[str, ...] = ()
    flag: str | None = None  # "--name", or "--name/--no-name" for a bool; a bool with one name is a switch
    help: str = ""
    aliases: tuple[str, ...] = ()  # older spellings that keep working (hidden from the help where possible)
    multiple: bool = False  # repeatable: the value is a tuple of `kind`
    metavar: str | None = None
    envvar: str | None = None
    per_command: tuple[tuple[str, Any], ...] = ()  # (command path, its default): the one place a default differs
    hidden: bool = False  # internal: not in the help

    def expected(self) -> str:
        if self.choices:
            what = f"one of {', '.join(self.choices)}"
        elif self.kind is bool:
            what = "true or false"
        elif self.kind is str:
            what = "a string"
        else:
            what = "an integer" if self.kind is int else "a number"
            if self.low is not None:
                what += f" {'>' if self.low_open else '>='} {self.low:g}"
            if self.high is not None:
                what += f"{' and' if self.low is not None else ''} {'<' if self.high_open else '<='} {self.high:g}"
        if self.multiple:
            what = f"a list of {what}"
        return what + (" or null" if self.optional else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.multiple:
            return isinstance(value, (tuple, list)) and all(self._accepts_one(v) for v in value)
        return self._accepts_one(value)

    def _accepts_one(self, value: Any) -> bool:
        if self.kind is float:
            fits = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        elif self.kind is int:
            fits = isinstance(value, int) and not isinstance(value, bool)
        else:
            fits = isinstance(value, self.kind)
        if not fits or (self.choices and value not in self.choices):
            return False
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def default_for(self, command: str | None, default: Any) -> Any:
        """The field's default, or the one its rule declares for `command`."""
        return dict(self.per_command).get(command, default) if command else default

    def default_note(self, command: str | None, default: Any) -> str:
        """What the help says where `command` declares its own default."""
        if not command or command not in dict(self.per_command) or (self.kind is bool and "/" not in (self.flag or "")):
            return ""  # a switch is off unless given
        return f" [{command}'s own default; elsewhere {_shown(default)}]"


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def setting(default: Any, rule: Rule) -> Any:
    """A group field: its default and its rule."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("a setting's default must be immutable (a tuple, not a list)")
    return field(default=default, metadata={"rule": rule})


def rules_of(group: type) -> dict[str, Rule]:
    """Every rule of a group, by field name, in declaration order (fields without a rule are left out)."""
    return {f.name: f.metadata["rule"] for f in dataclasses.fields(group) if "rule" in f.metadata}


@dataclass(frozen=True)
class Settings:
    """Base of every group: each ruled field checked at construction, floats stored as floats, lists as
    tuples; `check` adds the rules between fields."""

    GROUP: ClassVar[str] = "settings"  # the name errors and the run log's record use

    def __post_init__(self) -> None:
        for name, rule in rules_of(type(self)).items():
            value = getattr(self, name)
            if rule.multiple and isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, name, value)
            if not rule.accepts(value):
                raise SettingError(self.GROUP, name, f"must be {rule.expected()}, got {value!r}")
            if rule.kind is float and value is not None and not rule.multiple:
                object.__setattr__(self, name, float(value))
        self.check()

    def check(self) -> None:
        """Rules between fields (raise `self.refuse(...)`)."""

    def refuse(self, name: str, message: str) -> SettingError:
        return SettingError(self.GROUP, name, message)

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Any:
        """The group a worker was handed; a key no field has is refused (a launcher of another version)."""
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{cls.GROUP} settings have unknown field(s): {', '.join(unknown)}")
        return cls(**raw)
