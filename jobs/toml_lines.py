"""Where each key of a TOML text was written, so that recipe messages can name the line.

tomllib gives values but no positions; this reads the text line by line instead. It only has to
be right for keys a person wrote (tables, `[[arrays]]`, dotted keys, inline tables on one line);
values spanning several lines (arrays, multi-line strings) are skipped over, never parsed.
"""

from __future__ import annotations

import re

_BARE_OR_QUOTED = r"""(?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')"""
_KEY_LINE = re.compile(rf"""^\s*({_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*)\s*=(.*)$""")
_INLINE_KEY = re.compile(r"""[{,]\s*([A-Za-z0-9_\-]+|"[^"]*")\s*=""")


def _strip_key(part: str) -> str:
    """One key part as tomllib names it: surrounding space and quotes removed."""
    part = part.strip()
    if len(part) >= 2 and part[0] == part[-1] and part[0] in "\"'":
        return part[1:-1]
    return part


def _split_dotted(text: str) -> list[str]:
    """`a."b.c".d` -> ["a", "b.c", "d"]: dots inside quotes belong to the key."""
    parts, buf, quote = [], "", None
    for ch in text:
        if quote:
            buf += ch
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
            buf += ch
        elif ch == ".":
            parts.append(_strip_key(buf))
            buf = ""
        else:
            buf += ch
    parts.append(_strip_key(buf))
    return parts


def _bracket_delta(text: str) -> int:
    """Net [ / { nesting of a line, ignoring strings and comments."""
    depth, quote, i = 0, None, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        i += 1
    return depth


def key_lines(text: str) -> dict[str, int]:
    """Map every key path of a TOML text to its line (1-based); `[[job]]` entries are `job[i]`."""
    lines: dict[str, int] = {}
    prefix: list[str] = []
    array_counts: dict[str, int] = {}
    depth = 0
    in_multiline: str | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if in_multiline:
            if in_multiline in line:
                in_multiline = None
            continue
        if depth > 0:
            depth += _bracket_delta(line)
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith("[["):
            name = line[2:line.index("]]")] if "]]" in line else line[2:]
            parts = _split_dotted(name)
            base = ".".join(parts)
            index = array_counts.get(base, 0)
            array_counts[base] = index + 1
            prefix = parts[:-1] + [f"{parts[-1]}[{index}]"]
            lines.setdefault(".".join(prefix), number)
            continue
        if line.startswith("["):
            name = line[1:line.index("]")] if "]" in line else line[1:]
            prefix = _split_dotted(name)
            lines.setdefault(".".join(prefix), number)
            continue
        match = _KEY_LINE.match(line)
        if not match:
            continue
        path = prefix + _split_dotted(match.group(1))
        for i in range(len(prefix) + 1, len(path) + 1):
            lines.setdefault(".".join(path[:i]), number)
        value = match.group(2)
        for quote in ('"""', "'''"):
            if value.count(quote) == 1:
                in_multiline = quote
        if value.lstrip().startswith("{"):
            for inner in _INLINE_KEY.finditer(value):
                lines.setdefault(".".join(path + [_strip_key(inner.group(1))]), number)
        depth = max(0, _bracket_delta(value))
    return lines
