"""Turns as they appear in the wild (ShareGPT's from/value, OpenAI's role/content) -> our turns.

A normalized row is `{"id", "conversations": [{"role", "content"}, ...], "reference"}` (plus
source-specific extras such as MT-Bench's `turns`). Every later stage (regeneration, training,
benchmarks) reads only this shape, so each source is mapped to it once, at preparation.
"""

from __future__ import annotations

from typing import Any

from adaflash.data.errors import RowError

Row = dict[str, Any]
Conversation = list[dict[str, str]]

# Role names seen in public chat datasets -> ours.
ROLE_MAP = {
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
    "bard": "assistant", "model": "assistant",
    "system": "system",
}


def _turn_text(value: Any) -> str | None:
    """A turn's text: a string, or OpenAI-style content parts joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        parts = [p.get("text") for p in value if p.get("type", "text") == "text"]
        if parts and all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return None


def normalize_turns(raw: Any) -> Conversation:
    """role/content or from/value turns -> ours; blank turns dropped, needs a user turn."""
    if not isinstance(raw, list):
        raise RowError("conversations is not a list")
    turns: Conversation = []
    for turn in raw:
        if not isinstance(turn, dict):
            raise RowError("a turn is not an object")
        role = turn.get("role", turn.get("from"))
        content = _turn_text(turn.get("content", turn.get("value")))
        if not isinstance(role, str) or role.lower() not in ROLE_MAP:
            raise RowError(f"unknown role {role!r}")
        if content is None:
            raise RowError("a turn has no text content")
        if not content.strip():
            continue
        mapped = ROLE_MAP[role.lower()]
        if mapped == "system" and turns:
            raise RowError("system turn after the start")
        if mapped == "assistant" and not any(t["role"] == "user" for t in turns):
            continue  # an answer with no question before it (ShareGPT has some)
        turns.append({"role": mapped, "content": content})
    if not any(t["role"] == "user" for t in turns):
        raise RowError("no user turn")
    return turns
