"""Regeneration: the target answers a dataset's prompts, so drafters train on what it says.

Why: a drafter is judged by how often the target accepts its tokens, so it should learn the
target's own answers, not the dataset's. Each output row keeps the exact prompt string the
engine saw (`prompt_text`, chat template applied) and the response token ids, so training
sees precisely what inference will see.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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


def output_row(row: PromptRow, out: Output) -> dict[str, Any]:
    """One training row: prompt turns + the target's answer, with the exact prompt string."""
    meta = out.meta_info
    finish = meta.get("finish_reason")
    return {
        "id": row.id,
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


def regenerate(
    engine: Engine,
    prompts: list[PromptRow],
    params: SamplingParams,
    *,
    chat: bool = True,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> RegenerateResult:
    """Answer every prompt (batched by the engine); rows come back in input order.

    A prompt the engine refuses (too long for the context with max_new_tokens, empty after
    rendering) is skipped with its reason instead of failing the whole run.
    """
    target = engine.target
    result = RegenerateResult(rows=[])
    by_rid: dict[str, PromptRow] = {}
    order: list[str] = []
    for row in prompts:
        if row.id in by_rid:
            result.skipped[row.id] = "duplicate id"
            continue
        text = target.render(row.prompt, chat=chat)
        request = Request(target.encode(text), replace(params), prompt_text=text, rid=row.id)
        try:
            engine.add(request)
        except ValueError as err:
            result.skipped[row.id] = str(err)
            continue
        by_rid[row.id] = row
        order.append(row.id)
    done: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    while engine.has_work():
        for event in engine.step():
            if event.output is None:
                continue
            out_row = output_row(by_rid[event.rid], event.output)
            done[event.rid] = out_row
            result.completion_tokens += int(event.output.meta_info["completion_tokens"])
            result.verify_ct += int(event.output.meta_info["spec_verify_ct"])
            if on_done is not None:
                on_done(out_row)
    result.duration = time.perf_counter() - started
    result.rows = [done[rid] for rid in order]
    return result
