"""Regeneration: the target answers a dataset's prompts, so drafters train on what it says.

Why: a drafter is judged by how often the target accepts its tokens, so it should learn the
target's own answers, not the dataset's. Each output row keeps the exact prompt string the
engine saw (`prompt_text`, chat template applied) and the response token ids, so training
sees precisely what inference will see.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from adaflash.data.prompts import PromptRow
from adaflash.engine.engine import Engine
from adaflash.engine.params import Output, Request, SamplingParams
from adaflash.models.loading import Target


@dataclass
class RegenerateResult:
    rows: list[dict[str, Any]]
    skipped: dict[str, str] = field(default_factory=dict)  # id -> why
    completion_tokens: int = 0
    verify_ct: int = 0
    duration: float = 0.0
    unfinished: int = 0  # prompts left when the time budget ran out (`--resume` answers them)

    @property
    def accept_length(self) -> float:
        """τ over all answers: tokens emitted per target verify step (1.0 without a drafter)."""
        return self.completion_tokens / max(self.verify_ct, 1)

    @property
    def output_throughput(self) -> float:
        return self.completion_tokens / self.duration if self.duration > 0 else 0.0


DRAFT_MARGIN = 256  # room for a drafter's block beyond prompt + max_new_tokens


def fit_max_len(target: Target, prompts: list[PromptRow], *, chat: bool, max_new_tokens: int,
                cap: int = 4096) -> int:
    """KV-cache length for these prompts: the longest + max_new_tokens + a draft margin.

    Why: the engine's cache is allocated up front for every slot; sizing it to the data instead
    of the target's context keeps a 16-slot batch in hundreds of MB rather than gigabytes.
    """
    longest = max((len(target.encode(target.render(p.prompt, chat=chat))) for p in prompts), default=0)
    return max(1, min(target.max_context, cap, longest + max_new_tokens + DRAFT_MARGIN))


def _prompt_turns(prompt: str | list[dict[str, str]]) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(turn) for turn in prompt]


def output_row(row: PromptRow, out: Output, *, compact: bool = False) -> dict[str, Any]:
    """One training row: prompt turns + the target's answer, with the exact prompt string.

    `compact` keeps what training reads (the prompt string and the answer's token ids) and drops
    the answer's text and the turns, which repeat them: a third of the size.
    """
    meta = out.meta_info
    finish = meta.get("finish_reason")
    full = {
        "id": row.id,
        "domain": row.domain,
        "prompt_text": out.prompt_text,
        "conversations": _prompt_turns(row.prompt) + [{"role": "assistant", "content": out.text}],
        "response": out.text,
        "output_ids": list(out.output_ids),
        "reference": row.reference,
        "finish_reason": finish.get("type") if isinstance(finish, dict) else finish,
        "meta": {key: meta.get(key) for key in (
            "prompt_tokens", "completion_tokens", "spec_verify_ct", "spec_accept_length", "spec_accept_rate",
            "e2e_latency", "method", "drafter_version",
        )},
    }
    if row.domain is None:
        del full["domain"]
    if compact:
        for key in ("conversations", "response", "reference"):
            del full[key]
        full["meta"] = {k: full["meta"][k] for k in ("prompt_tokens", "completion_tokens")}
    return full


class PartialRows:
    """Finished rows appended to `<out>.partial` as they come, so a killed or timed-out run resumes.

    Why a side file: the output itself is written atomically once, at the end; the partial file is
    the only thing a crash can leave, and a torn last line there is simply answered again.
    """

    def __init__(self, out: str | Path, *, resume: bool) -> None:
        self.path = Path(str(out) + ".partial")
        self.rows: dict[str, dict[str, Any]] = {}
        if resume and self.path.is_file():
            with self.path.open(encoding="utf-8") as handle:
                for line in handle:
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # the line a killed run was writing
                    if isinstance(row, dict) and isinstance(row.get("id"), str):
                        self.rows[row["id"]] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("w", encoding="utf-8")
        for row in self.rows.values():  # rewritten whole: drops a torn line for good
            self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._handle.flush()

    def add(self, row: dict[str, Any]) -> None:
        self.rows[row["id"]] = row
        self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._handle.flush()

    def close(self, *, done: bool) -> None:
        """`done`: the output holds every row now, so the partial file goes."""
        self._handle.close()
        if done:
            os.unlink(self.path)


def shard_of(prompts: list[PromptRow], spec: str) -> list[PromptRow]:
    """Every N-th prompt from the I-th, for `spec` "I/N": independent processes (or GPUs) split one dataset."""
    index, sep, count = spec.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not sep or n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard wants I/N with 0 <= I < N, got {spec!r}")
    return prompts[i::n]


def regenerate(
    engine: Engine,
    prompts: list[PromptRow],
    params: SamplingParams,
    *,
    chat: bool = True,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    compact: bool = False,
    deadline: float | None = None,
) -> RegenerateResult:
    """Answer every prompt (batched by the engine); rows come back in input order.

    A prompt the engine refuses (too long for the context with max_new_tokens, empty after
    rendering) is skipped with its reason instead of failing the whole run. At `deadline`
    (time.monotonic()) no new prompt starts; those decoding finish, the rest count as unfinished.
    """
    target = engine.target
    result = RegenerateResult(rows=[])
    by_rid: dict[str, PromptRow] = {}
    order: list[str] = []
    for row in prompts:
        if row.id in by_rid:
            result.skipped[row.id] = "duplicate id"
            continue
        by_rid[row.id] = row
        order.append(row.id)
    queued = iter(order)
    # Prompts are rendered and queued a few batches ahead of the engine, not all at once: a large
    # corpus starts at once, and a deadline leaves only a short queue to drop.
    ahead = 2 * engine.max_batch

    def feed() -> None:
        while len(engine.waiting) < ahead:
            rid = next(queued, None)
            if rid is None:
                return
            text = target.render(by_rid[rid].prompt, chat=chat)
            try:
                engine.add(Request(target.encode(text), replace(params), prompt_text=text, rid=rid))
            except ValueError as err:
                result.skipped[rid] = str(err)

    done: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    feed()
    draining = False
    while engine.has_work():
        if deadline is not None and not draining and time.monotonic() >= deadline:
            # Past the budget: take no new prompt, let the rows in flight finish (at most
            # max_new_tokens steps), so no answer already half made is thrown away.
            draining = True
            for request, _arrived in list(engine.waiting):
                engine.abort(request.rid)
        for event in engine.step():
            if event.output is None:
                continue
            out_row = output_row(by_rid[event.rid], event.output, compact=compact)
            done[event.rid] = out_row
            result.completion_tokens += int(event.output.meta_info["completion_tokens"])
            result.verify_ct += int(event.output.meta_info["spec_verify_ct"])
            if on_done is not None:
                on_done(out_row)
        if not draining:
            feed()
    result.unfinished = sum(1 for rid in order if rid not in done and rid not in result.skipped)
    result.duration = time.perf_counter() - started
    result.rows = [done[rid] for rid in order if rid in done]
    return result
