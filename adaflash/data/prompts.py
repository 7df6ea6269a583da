"""Reading prompt files: `{"prompt": "..."}` rows or normalized rows with `conversations`."""

from __future__ import annotations

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
    domain: str | None = None  # the suite's domain (math, code, chat, ...), carried into every result


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
        return PromptRow(rid, row["prompt"], row.get("reference"), _domain(row))
    conv = row.get("conversations")
    if isinstance(conv, list) and conv:
        for turn in conv:
            if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or not isinstance(turn.get("content"), str):
                raise PromptFileError(f"{where}: every conversations entry needs string 'role' and 'content'")
        turns = conversation_prompt(conv)
        if not turns:
            raise PromptFileError(f"{where}: conversations hold no turn before the answer")
        return PromptRow(rid, turns, row.get("reference"), _domain(row))
    raise PromptFileError(f"{where}: expected a string 'prompt' or a non-empty 'conversations' list")


def _domain(row: dict[str, Any]) -> str | None:
    domain = row.get("domain")
    return domain if isinstance(domain, str) and domain else None


def prompt_source(spec: str | Path, workspace: str | Path, split: str) -> Path:
    """A prompt file given as a path, or as the name of a dataset `adaflash data prepare` wrote.

    One rule for every command: training commands read a name's train split, measurements its test split.
    """
    path = Path(spec).expanduser()
    if path.is_file() or path.suffix in (".jsonl", ".json") or len(path.parts) > 1:
        return path
    prepared = Path(workspace) / "data" / f"{spec}_{split}.jsonl"
    if not prepared.is_file():
        raise PromptFileError(f"{spec}: neither a file nor a prepared dataset ({prepared} does not exist); "
                              f"run `adaflash --workspace {workspace} data prepare {spec}` or give a JSONL file")
    return prepared


def read_prompt_file(path: str | Path, limit: int | None = None, skip: int = 0) -> list[PromptRow]:
    """Prompts `skip` .. `skip + limit` of the file (every row read is checked)."""
    from adaflash.data.io import read_jsonl

    rows: list[PromptRow] = []
    seen = 0
    for where, raw in read_jsonl(path, PromptFileError):
        row = row_to_prompt(raw, where)
        seen += 1
        if seen <= skip:
            continue
        rows.append(row)
        if limit and len(rows) >= limit:
            break
    if not rows and skip:
        raise PromptFileError(f"{path}: holds {seen} prompts, none left after skipping {skip} (--skip)")
    if not rows:
        raise PromptFileError(f"{path}: holds no prompts")
    return rows
