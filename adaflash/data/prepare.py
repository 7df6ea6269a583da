"""Writing a resolved source as prepared splits: `<name>_train.jsonl` and `<name>_test.jsonl`.

The split is deterministic: a row goes to test when a hash of (seed, id) falls below the test
fraction, so it does not depend on row order and a row keeps its split when the file grows.
Sources with an official split (GSM8K, folders and hub datasets with train and test) keep it.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaflash.data.conversations import Row
from adaflash.data.errors import DatasetError, RowError
from adaflash.data.io import atomic_jsonl
from adaflash.data.sources import SPLITS, DatasetSource, Normalizer, RawRows

MAX_SKIP_EXAMPLES = 5


@dataclass
class PrepareStats:
    """What happened to the rows: written per split, skipped by reason, truncation."""

    written: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    skip_examples: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        if len(self.skip_examples) < MAX_SKIP_EXAMPLES:
            self.skip_examples.append(f"{where}: {reason}")

    def truncate(self, where: str) -> None:
        """The file ends mid-array: what came before is kept, the cut element is counted."""
        self.truncated.append(where)
        self.skip("truncated at the end of the file", where)


def split_of(row_id: str, seed: int, test_fraction: float) -> str:
    """`test` when hash(seed, id) falls below the fraction: independent of row order."""
    digest = hashlib.sha256(f"{seed}\x00{row_id}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2.0**64
    return "test" if unit < test_fraction else "train"


def prepare_dataset(
    src: DatasetSource,
    out_dir: str | os.PathLike,
    *,
    split_seed: int = 0,
    test_fraction: float | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """Write `<name>_train.jsonl` and `<name>_test.jsonl` atomically; returns the summary."""
    if test_fraction is not None and src.official_split:
        raise DatasetError(f"{src.name} keeps its official train/test split; --test-fraction does not apply")
    if test_fraction is not None and not 0.0 <= test_fraction <= 1.0:
        raise DatasetError(f"--test-fraction must be within [0, 1], got {test_fraction}")
    fraction = src.default_test_fraction if test_fraction is None else test_fraction
    out = Path(out_dir).expanduser()
    paths = {split: out / f"{src.name}_{split}.jsonl" for split in SPLITS}
    reads = Path(str(src.location)).expanduser()
    for path in paths.values():
        if reads.exists() and path.exists() and (reads == path or reads.resolve() == path.resolve()):
            raise DatasetError(f"{path}: the output would replace the file it is read from; give another --name "
                               "or --out")
    stats = PrepareStats()
    raw = src.read(stats)
    with atomic_jsonl(paths["train"], paths["test"]) as (train, test):
        writers = {"train": train, "test": test}
        for split, row in _split_rows(raw, src.normalize, stats, split_seed, fraction, limit):
            writers[split].write(row)
            stats.written[split] += 1
        if not sum(stats.written.values()):  # raised inside: the files already there are kept
            reasons = ", ".join(f"{count} {why}" for why, count in stats.skipped.most_common(3))
            raise DatasetError(f"{src.location}: no usable rows" + (f" ({reasons})" if reasons else " (it is empty)")
                               + f"; {paths['train'].name} and {paths['test'].name} are left as they were")
    official = isinstance(raw, dict)
    return {
        "dataset": src.name,
        "kind": src.kind,
        "source": src.location,
        "split": "official" if official else "hash",
        "split_seed": None if official else split_seed,
        "test_fraction": None if official else fraction,
        "limit": limit,
        "rows": {split: stats.written[split] for split in SPLITS},
        "files": {split: str(paths[split]) for split in SPLITS},
        "skipped": sum(stats.skipped.values()),
        "skipped_reasons": dict(stats.skipped),
        "skipped_examples": stats.skip_examples,
        "truncated": stats.truncated,
    }


def _split_rows(raw: dict[str, RawRows] | RawRows, normalize: Normalizer, stats: PrepareStats, seed: int,
                fraction: float, limit: int | None) -> Iterator[tuple[str, Row]]:
    """(split, row) for every kept row: the source's own split when it has one, else the hash split."""
    seen: set[str] = set()
    if isinstance(raw, dict):
        for split, rows in raw.items():
            for row in _take(rows, normalize, split, stats, seen, limit):
                yield split, row
    else:
        for row in _take(raw, normalize, "all", stats, seen, limit):
            yield split_of(row["id"], seed, fraction), row


def _take(rows: RawRows, normalize: Normalizer, split: str, stats: PrepareStats, seen: set[str],
          limit: int | None) -> Iterator[Row]:
    """Normalized rows, up to `limit`; bad rows and repeated ids are skipped and counted."""
    taken = 0
    for index, (where, raw) in enumerate(rows):
        if limit is not None and taken >= limit:
            return
        try:
            row = normalize(raw, index, split)
        except RowError as err:
            stats.skip(str(err), where)
            continue
        if row["id"] in seen:
            stats.skip("duplicate id", where)
            continue
        seen.add(row["id"])
        taken += 1
        yield row
