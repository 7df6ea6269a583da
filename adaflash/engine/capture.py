"""Capturing every CUDA graph an engine can meet, before any request pays for a capture.

A server (and `eval`, and `bench engine`) calls this once: each batch bucket × context bucket ×
block width, for every pass decoding takes (the fused greedy steps, verify, draft, extend) and the
admissions' padded prefills. Apart from `passes` because it only drives the passes with dummy
inputs; what each pass does lives there.
"""

from __future__ import annotations

import torch

from adaflash.engine.graphs import bucket
from adaflash.engine.passes import PREFILL_MIN_WIDTH, DevicePasses, LengthChooser


@torch.no_grad()
def capture_all(passes: DevicePasses, max_context: int | None = None, *, steps: int | None = None,
                choose: LengthChooser | None = None, ahead: bool = False, idle: bool = False) -> int:
    """Capture every graph up to `max_context`; `steps` and `choose` must be the ones decoding uses,
    `ahead` whether the cost rule sizes overlapped steps (`VerifyLengths._sizes_ahead`): then the fused
    steps of every width, with the length head, too.

    Inputs point at the scratch slot, so no sequence is touched; when no slot is live (`idle`), the
    passes over slots 0..b-1 in order are captured too (`DevicePasses.rows_for`). Returns the number
    of graphs.
    """
    if not passes.graphs.enabled:
        return 0
    cache = passes.cache
    top = passes.kv_bucket(min(max_context or cache.max_len, cache.max_len))
    kvs, kv = [], 128
    while kv < top:
        kvs.append(kv)
        kv *= 2
    kvs.append(top)
    widest = passes.widest
    widths = sorted({w if passes.exact_widths else bucket(w, widest) for w in range(1, widest + 1)})
    for b in sorted({bucket(b, passes.max_batch) for b in range(1, passes.max_batch + 1)}):
        scratch = torch.full((b,), passes.scratch, dtype=torch.long, device=passes.device)
        for in_order in (False, True) if idle else (False,):
            rows = torch.arange(b, device=passes.device) if in_order else scratch
            _capture_decode(passes, rows, kvs, top, widths, steps=steps, choose=choose, ahead=ahead,
                            in_order=in_order)
        _capture_admissions(passes, scratch, top)
    return len(passes.graphs)


def _zeros(passes: DevicePasses, b: int, w: int | None = None) -> torch.Tensor:
    return torch.zeros((b,) if w is None else (b, w), dtype=torch.long, device=passes.device)


def _capture_admissions(passes: DevicePasses, rows: torch.Tensor, top: int) -> None:
    """The prefills of each padded width, then the drafter's extend over the same width."""
    b, width = rows.shape[0], PREFILL_MIN_WIDTH
    while width <= top and (dims := passes.prefill_dims(b, width)) is not None:
        width = dims[1]
        passes.prefill(_zeros(passes, b, width), rows, _zeros(passes, b) + 1)
        if passes.drafter is not None:
            passes.extend_drafter(rows, _zeros(passes, b), _zeros(passes, b) + 1, 0, width, lane="admit")
        width *= 2  # past max_len (the widest bucket) it is past `top` too


def _capture_decode(passes: DevicePasses, rows: torch.Tensor, kvs: list[int], top: int, widths: list[int], *,
                    steps: int | None, choose: LengthChooser | None, ahead: bool, in_order: bool) -> None:
    """The decode passes of one batch bucket."""
    b, widest = rows.shape[0], passes.widest
    zeros = lambda w=None: _zeros(passes, b, w)  # noqa: E731
    for kv in kvs:
        for w in widths:
            if kv - w < 0:
                continue
            # Greedy requests take the fused step (when the cost rule sizes steps ahead, every greedy step
            # drafts inside it: `draft_and_step` below); sampled ones verify, then extend.
            if not ahead:
                passes.greedy_step(rows, zeros(), zeros(w - 1), zeros(), zeros() + kv - w, kv - w, in_order=in_order)
            if w == bucket(w, widest):  # a sampled verify's widths stay powers of two (`DevicePasses._dims`)
                passes.verify(rows, zeros(w), zeros() + kv - w, kv - w, in_order=in_order)
            if passes.drafter is not None:
                passes.extend_drafter(rows, zeros() + kv - w, zeros() + 1, kv - w, w, in_order=in_order)
        if passes.drafter is not None:
            base = kv - widest
            if choose is not None:  # the head's graph; whole-block greedy steps draft inside theirs
                passes.draft(rows, zeros(), zeros() + base, base, steps=steps, choose=choose, in_order=in_order)
            passes.draft(rows, zeros(), zeros() + base, base, steps=steps, choose=None, in_order=in_order)
            # its key pairs the drafter's context bucket with the verify's kv bucket: both pairings
            fused = [(steps, False)] + ([(w - 1, True) for w in widths if w > 1] if ahead else [])
            for longest in (base, kv):
                if longest + widest <= top:
                    for drafts, predict in fused:
                        passes.draft_and_step(rows, zeros(), zeros() + longest, longest, steps=drafts,
                                              predict=predict, in_order=in_order)
