"""`--set key.path=value` overrides, applied to a recipe's parsed TOML before it is checked.

They are applied to the data rather than the text so that every check sees one shape; the key
paths they set are remembered so that a mistake they cause is reported as coming from `--set`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobs.assign import RESERVED_KEYS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


# Tables whose keys only mean something when the recipe uses them: a new key set from the command line
# (a typo of an existing one, most likely) would change nothing.
NAMED_TABLES = {"vars": "var", "gpus": "GPU role"}
TABLE_OPTIONS = {"gpus": RESERVED_KEYS}  # keys of those tables that are settings, not names


def parse_override(text: str) -> tuple[list[str], Any]:
    """`key.path=value`: the value as a TOML literal (`[0,1]`, `true`, `3`), else a plain string."""
    if "=" not in text:
        raise ValueError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ValueError(f"--set {text!r}: expected key.path=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, str]:
    """Set each `key.path=value` in `data`; returns key path -> the --set text that set it."""
    origins: dict[str, str] = {}
    for text in overrides:
        parts, value = parse_override(text)
        if len(parts) == 2 and parts[0] in NAMED_TABLES and parts[1] not in TABLE_OPTIONS.get(parts[0], ()):
            known = data.get(parts[0])
            if isinstance(known, dict) and parts[1] not in known:
                raise ValueError(f"--set {text}: the recipe has no {NAMED_TABLES[parts[0]]} {parts[1]!r} "
                                 f"(it has {', '.join(sorted(known)) or 'none'})")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"--set {text}: {'.'.join(parts[:i + 1])} is not a table")
            node = child
        node[parts[-1]] = value
        origins[".".join(parts)] = f"--set {text}"
    return origins
