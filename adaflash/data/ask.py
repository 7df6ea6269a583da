"""Prompts the target writes itself: more distinct questions to answer than any offline corpus holds.

Why: a drafter learns the target's answers, and held-out τ keeps rising with distinct answers, not
with epochs over the same ones. A small target follows "write a question about X" poorly (it answers
the instruction instead), but it continues a list well. So each ask is a plain-text page of
prompts people sent to an assistant, grouped by topic: two worked topics, then a new one left open
after "-". The target's continuation is read item by item until the first blank line.

Kept: items of 12 to 400 characters with a letter in them, each once by the hash of its normalized
text (case, spacing and punctuation aside), and none whose hash is among the held-out prompts given
(the suite's test split), so no measurement ever sees a prompt its drafter trained on.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adaflash.data.ask_topics import EXAMPLES, TOPICS

HEADER = "Questions and requests people sent to an AI assistant, grouped by topic.\n\n"
MIN_CHARS, MAX_CHARS = 12, 400
_WORDS = re.compile(r"[^\W_]+", re.UNICODE)

# (prompt text, seed) -> the target's continuation
Complete = Callable[[list[tuple[str, int]]], list[str]]


def page(topic: str, examples: Sequence[tuple[str, str, str]]) -> str:
    """The text the target continues: worked topics, then `topic` opened for its first item."""
    worked = "".join(f"Topic: {name}\n- {question}\n- {request}\n\n" for name, question, request in examples)
    return f"{HEADER}{worked}Topic: {topic}\n-"


def items(continuation: str) -> list[str]:
    """The list items of a continuation (it starts inside the first item), up to the first blank line."""
    block = continuation.split("\n\n", 1)[0]
    found = []
    for number, line in enumerate(block.split("\n")):
        if number and not line.startswith("- "):
            break  # the list ended (a heading, a note, a new topic)
        text = line[2:] if number else line
        found.append(text.strip().strip('"').strip())
    return found


def key(text: str) -> str:
    """The hash two prompts share when they differ only in case, spacing or punctuation."""
    return hashlib.sha256(" ".join(_WORDS.findall(text.lower())).encode()).hexdigest()


def usable(text: str) -> bool:
    return MIN_CHARS <= len(text) <= MAX_CHARS and any(c.isalpha() for c in text) and not text.startswith("Topic:")


@dataclass
class Asked:
    """What `ask` kept and why it dropped the rest."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    pages: int = 0
    items: int = 0
    unusable: int = 0
    repeats: int = 0
    held_out: int = 0


def ask(complete: Complete, count: int, *, seed: int = 0, held_out: Iterable[str] = (), batch: int = 64,
        max_pages: int | None = None, on_page: Callable[[Asked], None] = lambda _: None) -> Asked:
    """Up to `count` new prompts. Pages go to `complete` `batch` at a time: topic i of the page stream is
    TOPICS[i % len], with two worked examples drawn from `seed` and i. Stops after `max_pages` pages
    (default: 8 per prompt asked), so a target that repeats itself cannot loop forever."""
    banned = {key(text) for text in held_out}
    seen: set[str] = set()
    out = Asked()
    limit = max_pages if max_pages is not None else 8 * count
    while len(out.rows) < count and out.pages < limit:
        size = min(batch, limit - out.pages)
        asks = []
        for i in range(out.pages, out.pages + size):
            rng = random.Random(seed * 1_000_003 + i)
            asks.append((TOPICS[i % len(TOPICS)], page(TOPICS[i % len(TOPICS)], rng.sample(EXAMPLES, 2)),
                         seed * 1_000_003 + i))
        continuations = complete([(text, s) for _, text, s in asks])
        out.pages += size
        for (topic, _, _), continuation in zip(asks, continuations):
            for text in items(continuation):
                out.items += 1
                h = key(text)
                if not usable(text):
                    out.unusable += 1
                elif h in banned:
                    out.held_out += 1
                elif h in seen:
                    out.repeats += 1
                elif len(out.rows) < count:
                    seen.add(h)
                    out.rows.append({"id": f"ask-{h[:16]}", "domain": "ask", "topic": topic,
                                     "conversations": [{"role": "user", "content": text}], "reference": None})
        on_page(out)
    return out


def prompt_texts(rows: Iterable[dict[str, Any]]) -> Iterable[str]:
    """The user's text of each row (its `prompt`, else every user turn): what held-out hashes are taken of."""
    for row in rows:
        if isinstance(row.get("prompt"), str):
            yield row["prompt"]
        for turn in row.get("conversations") or []:
            if isinstance(turn, dict) and turn.get("role") == "user" and isinstance(turn.get("content"), str):
                yield turn["content"]
