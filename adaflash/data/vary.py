"""Prompt variants with their numbers redrawn: more distinct target answers from the same prompts.

Why: a drafter trained on one answer per GSM8K question learns those answers by heart (held-out τ
stops rising after a few thousand steps while the training acceptance keeps climbing). The same
question with other numbers makes the target write a new answer: the words stay in distribution,
while the numbers can no longer be recalled and must be read from the context, as on unseen prompts.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from adaflash.data.prompts import PromptRow

# A whole ASCII integer without leading zeros (007 is a code, not a count), at most 18 digits, not
# part of a decimal (3.5) or a grouped number (1,000), and not an ordinal (2nd: "3nd" would be wrong).
INTEGER = re.compile(r"(?<![0-9.,])(?:0|[1-9][0-9]{0,17})(?![0-9]|[.,][0-9]|(?:st|nd|rd|th)\b)")
VARIANT_SEP = "~v"


def redraw(n: int, rng: random.Random) -> int:
    """Another integer of about the same size: half to twice the value (1 → 2 or 3, 0 stays 0)."""
    if n == 0:
        return 0
    low, high = max(1, n // 2), max(2 * n, 3)
    value = rng.randint(low, high - 1)
    return value + 1 if value >= n else value  # skip n itself, keep the draw uniform


def vary_text(text: str, rng: random.Random, drawn: dict[str, str]) -> str:
    """`text` with each integer replaced; one integer gets one new value wherever it appears."""
    def swap(match: re.Match[str]) -> str:
        old = match.group(0)
        if old not in drawn:
            drawn[old] = str(redraw(int(old), rng))
        return drawn[old]

    return INTEGER.sub(swap, text)


def vary_prompt(prompt: str | list[dict[str, str]], rng: random.Random) -> str | list[dict[str, str]]:
    """The prompt with the numbers of its user turns redrawn (system and assistant turns kept)."""
    drawn: dict[str, str] = {}
    if isinstance(prompt, str):
        return vary_text(prompt, rng, drawn)
    return [{**turn, "content": vary_text(turn["content"], rng, drawn)} if turn.get("role") == "user" else dict(turn)
            for turn in prompt]


@dataclass
class VaryResult:
    rows: list[dict[str, object]] = field(default_factory=list)
    without_numbers: int = 0  # prompts with no integer to redraw (or only zeros): kept once, no variants
    repeats: int = 0  # variants left out: every draw repeated a prompt already written


def vary_rows(prompts: Iterable[PromptRow], variants: int, *, seed: int = 0) -> VaryResult:
    """Each prompt and `variants` redrawn copies of it, ids `<id>~v1`, `<id>~v2`, ...

    A variant keeps no reference: the dataset's answer belongs to the original numbers. Each prompt
    draws from its own generator (seed, id), so one row's variants do not depend on the rows before it.
    """
    result = VaryResult()
    for row in prompts:
        result.rows.append(_row(row.id, row.prompt, row.reference))
        if not _has_number(row.prompt):
            result.without_numbers += 1
            continue
        rng = random.Random(f"{seed}:{row.id}")
        seen = {_key(row.prompt)}
        for _ in range(variants):
            # small numbers leave few choices: redraw a few times rather than repeat a prompt
            new = next((p for p in (vary_prompt(row.prompt, rng) for _ in range(8)) if _key(p) not in seen), None)
            if new is None:
                result.repeats += 1
                continue
            seen.add(_key(new))
            result.rows.append(_row(f"{row.id}{VARIANT_SEP}{len(seen) - 1}", new, None))
    return result


def _has_number(prompt: str | list[dict[str, str]]) -> bool:
    """Whether a user turn holds an integer that a redraw changes (0 stays 0)."""
    texts = [prompt] if isinstance(prompt, str) else [t["content"] for t in prompt if t.get("role") == "user"]
    return any(match.group(0) != "0" for text in texts for match in INTEGER.finditer(text))


def _key(prompt: str | list[dict[str, str]]) -> str:
    return prompt if isinstance(prompt, str) else "\x00".join(turn["content"] for turn in prompt)


def _row(rid: str, prompt: str | list[dict[str, str]], reference: object) -> dict[str, object]:
    if isinstance(prompt, str):
        return {"id": rid, "prompt": prompt, "reference": reference}
    return {"id": rid, "conversations": prompt, "reference": reference}
