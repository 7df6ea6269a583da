"""Rows of any file or hub dataset -> normalized rows, by a `--column-map` or by common column names.

Why a map: datasets name the same thing differently (question/instruction/input, answer/output...);
the common names cover most files, and `--column-map prompt=COL,...` covers the rest.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from adaflash.data.conversations import Conversation, Row, normalize_turns
from adaflash.data.errors import RowError

COLUMN_KEYS = ("prompt", "answer", "id", "reference", "system", "conversations")
PROMPT_COLUMNS = ("prompt", "question", "instruction", "input", "query")
ANSWER_COLUMNS = ("answer", "response", "output", "completion", "solution")


def parse_column_map(text: str | None) -> dict[str, str]:
    """`prompt=question,answer=answer,id=task_id` -> {"prompt": "question", ...}."""
    if not text:
        return {}
    mapping: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, column = part.partition("=")
        key, column = key.strip(), column.strip()
        if not sep or not key or not column:
            raise ValueError(f"column map entry {part!r}: expected KEY=COLUMN")
        if key not in COLUMN_KEYS:
            raise ValueError(f"column map key {key!r}: expected one of {', '.join(COLUMN_KEYS)}")
        if key in mapping:
            raise ValueError(f"column map key {key!r} given twice")
        mapping[key] = column
    if "prompt" in mapping and "conversations" in mapping:
        raise ValueError("column map: give either prompt=... (and answer=...) or conversations=..., not both")
    return mapping


def normalize_row(raw: Any, column_map: dict[str, str], name: str) -> Row:
    """One source row -> a normalized row, by the column map or by common column names."""
    if not isinstance(raw, dict):
        raise RowError(f"row is a {type(raw).__name__}, not an object")
    if "conversations" in column_map:
        conversations = normalize_turns(_mapped(raw, column_map, "conversations"))
    elif "prompt" in column_map or not any(k in raw for k in ("conversations", "messages")):
        conversations = _prompt_conversation(raw, column_map)
    else:
        conversations = normalize_turns(raw["conversations"] if "conversations" in raw else raw["messages"])
    row_id = _row_id_of(raw, column_map, name, conversations)
    reference = _mapped(raw, column_map, "reference") if "reference" in column_map else raw.get("reference")
    return {"id": row_id, "conversations": conversations, "reference": reference}


def _mapped(raw: dict[str, Any], column_map: dict[str, str], key: str) -> Any:
    """The value of the column that `key` is mapped to; a row without that column is skipped."""
    col = column_map[key]
    if col not in raw:
        raise RowError(f"no column {col!r}")
    return raw[col]


def _prompt_conversation(raw: dict[str, Any], column_map: dict[str, str]) -> Conversation:
    """A prompt (with an optional system prompt and answer) as a conversation."""
    if "prompt" in column_map:
        prompt = _mapped(raw, column_map, "prompt")
    else:
        found = next((c for c in PROMPT_COLUMNS if c in raw), None)
        if found is None:
            raise RowError("no conversations and no prompt column (map one with --column-map prompt=COLUMN)")
        prompt = raw[found]
    if not isinstance(prompt, str) or not prompt.strip():
        raise RowError("prompt is empty or not a string")
    conversations: Conversation = []
    if "system" in column_map:
        system = _mapped(raw, column_map, "system")
        if isinstance(system, str) and system.strip():
            conversations.append({"role": "system", "content": system})
    conversations.append({"role": "user", "content": prompt})
    if "answer" in column_map:
        answer = _mapped(raw, column_map, "answer")
    else:
        answer = next((raw[c] for c in ANSWER_COLUMNS if c in raw), None)
    if answer is not None:
        if not isinstance(answer, str):
            raise RowError("answer is not a string")
        if answer.strip():
            conversations.append({"role": "assistant", "content": answer})
    return conversations


def _row_id_of(raw: dict[str, Any], column_map: dict[str, str], name: str,
               conversations: Conversation) -> str:
    """The mapped id, else the row's own `id`, else one derived from the content (stable across runs)."""
    if "id" in column_map:
        return _checked_id(_mapped(raw, column_map, "id"))
    if raw.get("id") is not None:
        return _checked_id(raw["id"])
    return _content_id(name, conversations)


def _checked_id(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise RowError("id is not a string or an integer")
    return str(value)


def _content_id(name: str, conversations: Conversation) -> str:
    digest = hashlib.sha1(json.dumps(conversations, sort_keys=True).encode()).hexdigest()[:16]
    return f"{name}-{digest}"
