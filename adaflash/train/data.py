"""Training sequences: exact prompt ids + response ids, in a reproducible order that can resume."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from adaflash.data.prompts import conversation_prompt
from adaflash.models.loading import Target


@dataclass
class Sequence:
    ids: list[int]
    response_start: int  # first position whose token the drafter learns to predict


class TrainDataError(ValueError):
    pass


def _token_ids(values: list) -> bool:
    return all(isinstance(i, int) and not isinstance(i, bool) for i in values)


def row_to_sequence(row: dict, target: Target, max_len: int, where: str) -> Sequence | None:
    """A regenerated row (prompt_text + output_ids, or + response) or a normalized row (conversations,
    last = answer). The answer's own token ids win over its text: re-encoding text need not give
    back the tokens the target produced."""
    ids = row.get("output_ids")
    given = row.get("prompt_ids")  # an adapting server's rows: the exact prompt tokens it served
    if isinstance(given, list) and given and _token_ids(given) and isinstance(ids, list) and ids and _token_ids(ids):
        full = (given + ids)[:max_len]
        return Sequence(full, len(given)) if len(full) - len(given) >= 2 else None
    if isinstance(row.get("prompt_text"), str) and isinstance(ids, list) and ids and _token_ids(ids):
        prompt_ids = target.encode(row["prompt_text"])
        full = (prompt_ids + ids)[:max_len]
        return Sequence(full, len(prompt_ids)) if len(full) - len(prompt_ids) >= 2 else None
    if isinstance(row.get("prompt_text"), str) and isinstance(row.get("response"), str):
        prompt, response = row["prompt_text"], row["response"]
    elif isinstance(row.get("conversations"), list) and row["conversations"]:
        turns = row["conversations"]
        if turns[-1].get("role") != "assistant":
            return None
        prompt = target.render(conversation_prompt(turns))
        response = turns[-1].get("content") or ""
    else:
        raise TrainDataError(f"{where}: expected 'prompt_text' + 'response' or 'conversations' ending with an answer")
    prompt_ids = target.encode(prompt)
    response_ids = target.encode(response)
    if not response_ids:
        return None
    if row.get("finish_reason", {}) and isinstance(row.get("finish_reason"), dict) and row["finish_reason"].get("type") == "stop":
        response_ids = response_ids + target.eos_ids[:1]
    ids = (prompt_ids + response_ids)[:max_len]
    if len(ids) - len(prompt_ids) < 2:
        return None
    return Sequence(ids, len(prompt_ids))


def load_sequences(paths: str | Path | Iterable[str | Path], target: Target, max_len: int,
                   limit: int | None = None) -> list[Sequence]:
    """The usable rows of one file, or of several files in turn (one corpus), `limit` of them at most."""
    from adaflash.data.io import read_jsonl

    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    for path in files:
        if not path.is_file():
            raise TrainDataError(f"{path}: no such file (make one with `adaflash data regenerate` or `adaflash data prepare`)")
    out: list[Sequence] = []
    for path in files:
        before = len(out)
        for where, row in read_jsonl(path, TrainDataError):
            if limit and len(out) >= limit:
                break
            seq = row_to_sequence(row, target, max_len, where)
            if seq is not None:
                out.append(seq)
        if len(out) == before and not (limit and len(out) >= limit):
            raise TrainDataError(f"{path}: no usable training rows")
    return out


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's order (and of its batches' order): a function of (seed, epoch) alone."""
    return seed * 1_000_003 + epoch


def epoch_order(count: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(count, generator=gen).tolist()


LENGTH_WINDOW = 4096  # sequences of the epoch order sorted by length together before batches are cut


def batches(order: list[int], sequences: list[Sequence], batch_tokens: int, seed: int = 0) -> list[list[int]]:
    """Groups of the epoch order whose padded size stays under batch_tokens, rows of like length together.

    Why: a batch is padded to its longest row, and in plain epoch order a 32,768-token batch of rows of
    40 to 1,024 tokens was mostly padding. Within each window of the order the rows are sorted by length
    before the batches are cut; the batches are then shuffled (`seed`), so a run still mixes lengths.
    """
    out: list[list[int]] = []
    for start in range(0, len(order), LENGTH_WINDOW):
        window = sorted(order[start : start + LENGTH_WINDOW], key=lambda i: len(sequences[i].ids))
        current: list[int] = []
        longest = 0
        for index in window:
            n = len(sequences[index].ids)
            if current and max(longest, n) * (len(current) + 1) > batch_tokens:
                out.append(current)
                current, longest = [], 0
            current.append(index)
            longest = max(longest, n)
        if current:
            out.append(current)
    shuffle = torch.randperm(len(out), generator=torch.Generator().manual_seed(seed)).tolist()
    return [out[i] for i in shuffle]


def epoch_batches(sequences: list[Sequence], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """One epoch's batches: its order and its batches' shuffle both a function of (seed, epoch)."""
    return batches(epoch_order(len(sequences), seed, epoch), sequences, batch_tokens, epoch_seed(seed, epoch))


def pad(sequences: list[Sequence], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [b, S] (0-padded), lengths [b], response starts [b]: one tensor from the host, not one a row."""
    lens = torch.tensor([len(s.ids) for s in sequences])
    ids = torch.zeros(len(sequences), int(lens.max()), dtype=torch.long)
    ids[torch.arange(ids.shape[1])[None, :] < lens[:, None]] = torch.tensor([t for s in sequences for t in s.ids])
    starts = torch.tensor([s.response_start for s in sequences])
    return ids.to(device), lens.to(device), starts.to(device)
