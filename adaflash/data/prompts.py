"""Reading prompt files: `{"prompt": "..."}` rows or normalized rows with `conversations`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Conversation = list[dict[str, str]]


class PromptFileError(ValueError):
    pass


@dataclass
class PromptRow:
    id: str
    prompt: str | Conversation
    reference: Any = None


def conversation_prompt(conversations: Conversation) -> Conversation:
    """The turns a model answers: everything before the final assistant turn."""
    turns = list(conversations)
    if turns and turns[-1].get("role") == "assistant":
        turns = turns[:-1]
    return turns


def row_to_prompt(row: Any, where: str) -> PromptRow:
    if not isinstance(row, dict):
        raise PromptFileError(f"{where}: expected a JSON object, got {type(row).__name__}")
    rid = str(row.get("id", where))
    if isinstance(row.get("prompt"), str):
        return PromptRow(rid, row["prompt"], row.get("reference"))
    conv = row.get("conversations")
    if isinstance(conv, list) and conv:
        for turn in conv:
            if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or not isinstance(turn.get("content"), str):
                raise PromptFileError(f"{where}: every conversations entry needs string 'role' and 'content'")
        turns = conversation_prompt(conv)
        if not turns:
            raise PromptFileError(f"{where}: conversations hold no turn before the answer")
        return PromptRow(rid, turns, row.get("reference"))
    raise PromptFileError(f"{where}: expected a string 'prompt' or a non-empty 'conversations' list")


def read_prompt_file(path: str | Path, limit: int | None = None) -> list[PromptRow]:
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"{path}: no such file")
    rows: list[PromptRow] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as err:
                raise PromptFileError(f"{where}: not valid JSON ({err.msg})") from None
            rows.append(row_to_prompt(raw, where))
            if limit and len(rows) >= limit:
                break
    if not rows:
        raise PromptFileError(f"{path}: holds no prompts")
    return rows
