"""Which prompts a benchmark sends: a prepared test split or a JSONL file, rendered client-side.

The chat template is applied here, with the target's own tokenizer, so the server (ours or SGLang,
whose /generate takes raw text) receives exactly the prompt text every method is measured on.
"""

from __future__ import annotations

import hashlib
import math
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
    domain: str | None = None


def load_rows(dataset: str, workspace: str | Path, num_prompts: int | None = None,
              seed: int | None = None) -> tuple[str, list[PromptRow]]:
    """(dataset name, rows): the first N rows, or N sampled with `seed` when a seed is given.

    A file whose rows carry a `domain` (the suite) gives N rows of each domain, so every domain is
    measured on as many prompts however the file is ordered.
    """
    try:
        path = prompt_source(dataset, workspace, "test")
        rows = read_prompt_file(path)
    except PromptFileError as err:
        raise BenchDataError(str(err)) from None
    name = path.name.removesuffix(".gz").removesuffix(".jsonl").removesuffix("_test")
    groups: dict[str | None, list[PromptRow]] = {}
    for row in rows:
        groups.setdefault(row.domain, []).append(row)
    picked: list[PromptRow] = []
    for group in groups.values():
        if num_prompts is None or num_prompts >= len(group):
            picked += group
        elif seed is not None:
            picked += random.Random(seed).sample(group, num_prompts)
        else:
            picked += group[:num_prompts]
    return name, picked  # a file holding fewer than num_prompts gives them all; the caller says so


def domains_of(prompts: list[Any]) -> list[str]:
    """The domains of a suite's prompts in first-seen order; [] for prompts without domains."""
    return list(dict.fromkeys(p.domain for p in prompts if p.domain)) if any(p.domain for p in prompts) else []


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
        return BenchPrompt(row.id, self._target.render(row.prompt, chat=self.chat), row.reference, row.domain)

    def count(self, text: str) -> int:
        return len(self._target.encode(text))


def raw_prompts(rows: list[PromptRow]) -> list[BenchPrompt]:
    """Without a tokenizer: plain prompts as they are (conversations joined), for --no-chat."""
    out = []
    for row in rows:
        text = row.prompt if isinstance(row.prompt, str) else "\n".join(m["content"] for m in row.prompt)
        out.append(BenchPrompt(row.id, text, row.reference, row.domain))
    return out


def answer_budget(prompt_id: str, max_new_tokens: int, spread: float) -> int:
    """The prompt's max_new_tokens under --length-spread: drawn from [(1 - spread) · N, N] by a hash of its
    id, so every method, batch size and command gives a prompt the same budget."""
    if spread <= 0:
        return max_new_tokens
    low = max(1, math.ceil((1 - spread) * max_new_tokens))
    draw = int.from_bytes(hashlib.sha256(f"length-spread:{prompt_id}".encode()).digest()[:8], "big") / 2 ** 64
    return low + int(draw * (max_new_tokens - low + 1))
