"""What verifying fewer drafts would gain, from a verify-cost curve and a drafter's acceptance by position.

Why: whether AdaFlash's length head can pay at all is a question of two measured curves. A verify of
L drafts (a pass of L + 1 tokens) yields 1 + a1 + a1·a2 + ... + a1···aL tokens on average, where ai is
the share of steps that accept drafted position i among those that reach it (`bench engine` prints it);
it costs the pass time at L + 1 tokens. The best fixed width maximizes their ratio. A length head that
tells steps apart can do better than the best fixed width; one that cannot, no better. The drafter's
own pass costs the same at every width, so it is left out (it only shrinks every gain).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from adaflash.bench.cost import CostBenchError, CostResult
from adaflash.engine.scripted import expected_tokens


def parse_acceptance(text: str) -> list[float]:
    """'0.55,0.72,...' -> shares in [0, 1], one per drafted position."""
    try:
        shares = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CostBenchError(f"--acceptance must be comma-separated numbers, got {text!r}") from None
    if not shares or any(not 0 <= s <= 1 for s in shares):
        raise CostBenchError(f"--acceptance takes one share in [0, 1] per drafted position, got {text!r}")
    return shares


def pass_ms(result: CostResult, batch: int, width: int) -> float:
    """The pass time at `width` tokens, linear between the measured widths around it."""
    measured = sorted(result.spec.widths)
    if not measured[0] <= width <= measured[-1]:
        raise CostBenchError(f"--acceptance: a block of {width} tokens lies outside the measured --widths "
                             f"{measured[0]}..{measured[-1]}; measure up to {width}")
    low = max(w for w in measured if w <= width)
    high = min(w for w in measured if w >= width)
    ms_low, ms_high = result.cell(batch, low)["ms"], result.cell(batch, high)["ms"]
    return ms_low if high == low else ms_low + (ms_high - ms_low) * (width - low) / (high - low)


def width_gains(result: CostResult, acceptance: Sequence[float]) -> list[dict[str, Any]]:
    """Per batch: the whole block's tokens per ms, the best width's, and the gain of the best over the whole."""
    block = len(acceptance) + 1
    rows = []
    for batch in result.spec.batch_sizes:
        rates = {drafts: expected_tokens(acceptance, drafts) / pass_ms(result, batch, drafts + 1)
                 for drafts in range(len(acceptance) + 1)}
        best = max(rates, key=lambda drafts: (rates[drafts], drafts))
        whole = len(acceptance)
        rows.append({"batch": batch, "block": block, "whole_tokens": expected_tokens(acceptance, whole),
                     "best_width": best + 1, "best_tokens": expected_tokens(acceptance, best),
                     "gain": rates[best] / rates[whole]})
    return rows
