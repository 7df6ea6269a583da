"""Which prompts a benchmark sends: a prepared test split or a JSONL file, rendered client-side.

The chat template is applied here, with the target's own tokenizer, so the server (ours or SGLang,
whose /generate takes raw text) receives exactly the prompt text every method is measured on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaflash.data.prompts import PromptFileError, PromptRow, prompt_source, read_prompt_file

BUILTIN_DATASETS = ("gsm8k", "humaneval", "mt-bench", "sharegpt")


class BenchDataError(ValueError):
    pass


@dataclass
class BenchPrompt:
    id: str
    text: str
    reference: Any = None


def load_rows(dataset: str, workspace: str | Path, num_prompts: int | None = None,
              seed: int | None = None) -> tuple[str, list[PromptRow]]:
    """(dataset name, rows): the first N rows, or N sampled with `seed` when a seed is given."""
    try:
        path = prompt_source(dataset, workspace, "test")
        rows = read_prompt_file(path, None if seed is not None else num_prompts)
    except PromptFileError as err:
        raise BenchDataError(str(err)) from None
    if seed is not None and num_prompts is not None and num_prompts < len(rows):
        rows = random.Random(seed).sample(rows, num_prompts)
    return path.stem.removesuffix("_test"), rows  # a file holding fewer than num_prompts gives them all; the caller says so


class PromptRenderer:
    """Turns prompt rows into the exact text the server gets, with the target's tokenizer."""

    def __init__(self, target: str, chat: bool = True) -> None:
        from transformers import AutoTokenizer

        from adaflash.models.loading import Target, local_folder

        folder = local_folder(target)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        # Target.render holds the one rendering rule the engine uses; it needs no model.
        self._target = Target(name=target, folder=folder, model=None, tokenizer=tokenizer, eos_ids=[])
        self.chat = chat

    def render(self, row: PromptRow) -> BenchPrompt:
        return BenchPrompt(row.id, self._target.render(row.prompt, chat=self.chat), row.reference)

    def count(self, text: str) -> int:
        return len(self._target.encode(text))


def raw_prompts(rows: list[PromptRow]) -> list[BenchPrompt]:
    """Without a tokenizer: plain prompts as they are (conversations joined), for --no-chat."""
    out = []
    for row in rows:
        text = row.prompt if isinstance(row.prompt, str) else "\n".join(m["content"] for m in row.prompt)
        out.append(BenchPrompt(row.id, text, row.reference))
    return out
