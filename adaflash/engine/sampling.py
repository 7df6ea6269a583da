"""Token selection from logits with per-row temperature / top-p / top-k / min-p (greedy when T == 0),
and the acceptance rule that keeps speculative decoding lossless.

A request with a `seed` draws the token at output position i by inverting the sampling distribution's
CDF at a uniform number that depends only on (seed, i). So its answer does not depend on what else is
in the batch, on how many drafts a step verifies, or on the method: a speculative engine emits, at
every position, the token plain decoding with the same seed would have drawn there.
"""

from __future__ import annotations

import hashlib

import torch

from adaflash.engine.params import SamplingParams
from adaflash.models.layers import greedy_ids


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    generator: torch.Generator | None = None,
    min_p: torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits [n, V]; per-row params [n]. Returns token ids [n]. `uniforms` [n]: a row with a number in
    (0, 1) draws by inverse CDF at it (seeded requests), a NaN row from `generator`."""
    greedy = greedy_ids(logits)
    hot = temperature > 0
    if not bool(hot.any()):
        return greedy
    rows = hot.nonzero(as_tuple=True)[0]
    probs = probabilities(logits[rows], temperature[rows], top_p[rows], top_k[rows],
                          None if min_p is None else min_p[rows])
    drawn = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    if uniforms is not None:
        fixed = uniforms[rows]
        seeded = ~fixed.isnan()
        if bool(seeded.any()):
            drawn = torch.where(seeded, inverse_cdf(probs, fixed.nan_to_num(0.5)), drawn)
    out = greedy.clone()
    out[rows] = drawn
    return out


def probabilities(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """The sampling distribution after temperature, top-k, top-p and min-p (rows with T > 0)."""
    scaled = logits.float() / temperature.clamp_min(1e-5).unsqueeze(-1)
    vocab = scaled.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    if bool((k < vocab).any()):
        kth = torch.topk(scaled, int(k.max()), dim=-1).values.gather(-1, (k - 1).unsqueeze(-1))
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if bool((top_p < 1).any()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= top_p.unsqueeze(-1), 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    if min_p is not None and bool((min_p > 0).any()):
        floor = probs.amax(-1, keepdim=True) * min_p.unsqueeze(-1)
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def position_uniform(seed: int, position: int) -> float:
    """A number in (0, 1) fixed by (seed, output position), the same on every machine."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") + 0.5) / 2.0**64


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative probability reaches u × total (never a zero-probability one)."""
    cdf = probs.double().cumsum(-1)
    target = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def sample_for(logits: torch.Tensor, params: list[SamplingParams], generator: torch.Generator,
               repeat: int = 1, positions: list[int] | None = None) -> torch.Tensor:
    """Sample logits [n * repeat, V] with each request's params repeated `repeat` times (one per position).
    `positions`: each request's output position of its first row here (seeded requests need it)."""
    if all(p.temperature == 0 for p in params):
        return greedy_ids(logits)  # decided on the host: no device round trip for greedy batches
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device).repeat_interleave(repeat)
    top_p = torch.tensor([p.top_p for p in params], device=device).repeat_interleave(repeat)
    top_k = torch.tensor([p.top_k for p in params], device=device).repeat_interleave(repeat)
    min_p = None
    if any(p.min_p > 0 for p in params):
        min_p = torch.tensor([float(p.min_p) for p in params], device=device).repeat_interleave(repeat)
    uniforms = None
    if any(p.seed is not None for p in params):
        if positions is None:
            raise ValueError("a seeded request needs the output positions of its rows")
        nan = float("nan")
        uniforms = torch.tensor([position_uniform(p.seed, at + j) if p.seed is not None else nan
                                 for p, at in zip(params, positions) for j in range(repeat)],
                                dtype=torch.float64, device=device)
    return sample(logits, temps, top_p, top_k, generator, min_p, uniforms)


def accepted_prefix(drafts: torch.Tensor, posterior: torch.Tensor, verify_n: torch.Tensor | None) -> torch.Tensor:
    """Per row, the longest verified prefix where each draft equals the target's own sample
    (`verify_n` None: every draft was verified, which spares three kernels a step).

    Sample-and-match: every emitted token is a target sample, so the output is the target's.
    """
    k = drafts.shape[1]
    if not k:
        return torch.zeros(drafts.shape[0], dtype=torch.long, device=drafts.device)
    match = drafts == posterior[:, :k]
    if verify_n is not None:
        match &= torch.arange(k, device=drafts.device)[None, :] < verify_n[:, None]
    return match.long().cumprod(dim=1).sum(dim=1)


def accept(drafts: torch.Tensor, posterior: torch.Tensor,
           verify_n: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted draft count [b] and the emitted row [b, k + 1]: the drafts with the bonus token
    (the target's own token after the accepted ones, the new pending token) at column `accepted`.
    Device ops only, so a replayed graph can hold it."""
    accepted = accepted_prefix(drafts, posterior, verify_n)
    bonus = posterior.gather(1, accepted[:, None])
    return accepted, torch.cat([drafts, bonus], dim=1).scatter(1, accepted[:, None], bonus)
