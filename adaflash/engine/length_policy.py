"""How many drafted tokens AdaFlash verifies, from the length head's prediction.

Two rules. "rate" is the design card's: verify `round(pred · B · rate)` block positions. "cost"
weighs what verifying costs on this machine: it times the engine's own speculative steps by verify
width and picks the width that maximizes the expected tokens per second of the whole batch. One width
for every row: a pass is as wide as its widest row, so a row that verifies fewer drafts than the
others saves nothing and only loses the tokens it would have accepted (with per-row choices
AdaFlash verified as wide as DFlash almost every step, at a lower τ). Why both: whether a
shorter verify saves anything depends on the hardware. On a 2-core CPU, SmolLM2 verifies 4 tokens
in about the time of 1 (the weights stream from memory either way), so any cut only loses τ; on a
CPU at block 8 the cost does grow with the width and the cuts pay.

The cost rule reads the head's prediction as the mean tokens a step would yield verifying the whole
block, m = pred · B, and models acceptance as geometric: each further draft is accepted with the
same probability a, so verifying L positions yields E_L = (1 - a^L) / (1 - a) tokens on average
(a solved from E_B = m). Step times are learned while serving: every width is first tried a few
times (outputs stay exact whatever the width), then the median of recent steps stands for each,
and the least recently measured width is retried now and then, since contexts grow.

Where the whole block costs no more than any shorter width (a GPU running this small target: the
step is bound by kernel launches, not by the width), the whole block wins for every row whatever
the head says, so the rule answers "verify everything" without reading the prediction. That spares
the host the sync a chosen width needs before it can size the verify pass, and on a GPU lets the
drafting run inside the step's one graph. Then the rule costs the host a few dict reads a step: it
reads its table every `recheck` steps, and re-times widths ever less often (a re-timing costs
several steps' time, its graphs captured on the clock). A batch smaller than one
whose whole blocks won takes them without timing tries of its own (`_inherits_whole`).

On an overlapping engine (a GPU, greedy rows) `choose` reads the predictions earlier steps brought back
with their tokens (`VerifyLengths._ahead_plan`), so a head-chosen step is overlapped like a whole-block one
and both are timed alike. Elsewhere a head-read step waits for its own draft, and those savings are not
in the per-width step times (every width is timed with the head read), so
where the timings alone favour shorter widths the rule also weighs the two modes as they really
run: head-read steps against whole-block steps that leave the head unread. Both are weighed on the
same steps, the head-read ones: their tokens per second against the tokens whole blocks would have
given them (what they gave, plus the geometric expectation past the width for each row that accepted
every draft it verified) over the median time of a whole-block step. Comparing what each mode's own
steps yielded instead confounds the mode with the prompts it happened to run on: a row's acceptance
swings far more from prompt to prompt than a verify width moves it, so that comparison kept the
head choosing on many steps where it bought nothing (each head-read step is dearer than a
whole-block one), costing throughput at the same τ. Both are weighed on recent steps only
(`mode_rate`): the mode that is not the better one runs only as retries, and its old steps, from a time
when the machine ran faster or slower, must not decide.
"""

from __future__ import annotations

import statistics
from collections import deque

import numpy as np
import torch

from adaflash.engine.graphs import bucket

_GRID = 2001  # acceptance probabilities tried when solving E_B(a) = m
# What the rule planned for a step: ((batch bucket, mode), each row's acceptance read by `drafts`), each None
# where nothing was planned.
Plan = tuple["tuple[int, str] | None", "np.ndarray | None"]


class CostRule:
    """The verify width maximizing the batch's expected tokens per second, Σ E_L / step_seconds(L),
    with step times measured online."""

    def __init__(self, block: int, min_length: int, *, max_batch: int = 1024, tries: int = 3, window: int = 16,
                 refresh: int = 64, slack: float = 0.02, mode_tries: int = 16, mode_window: int = 64,
                 whole_backoff: int = 8, recheck: int = 16, horizon: int = 256, margin: float = 0.03) -> None:
        self.block = block
        self.max_batch = max_batch
        self.min_length = max(1, min(min_length, block))
        self.tries = tries
        self.window = window
        self.refresh = refresh
        self.whole_backoff = whole_backoff
        self.recheck = recheck
        self.horizon = horizon  # older mode steps: whole blocks' no longer count, the head's are measured again
        self.margin = margin  # how much more the head's steps must yield to take over from whole blocks
        self.slack = slack  # the whole block stays "no dearer" within this fraction (timing noise)
        self.samples: dict[tuple[int, int], deque[float]] = {}
        self._medians: dict[tuple[int, int], float] = {}  # of each key's samples, refreshed when read
        self._stale: set[tuple[int, int]] = set()  # keys recorded since their median was taken
        self.last_seen: dict[tuple[int, int], int] = {}
        self.steps = 0
        # per batch bucket, recent head-read steps as (step, tokens, seconds, tokens whole blocks would
        # have given them), and recent whole-block steps as (step, seconds)
        self.mode_tries = mode_tries
        self.mode_window = mode_window
        self.choose_steps: dict[int, deque[tuple[int, int, float, float]]] = {}
        self.whole_seconds: dict[int, deque[tuple[int, float]]] = {}
        self._chosen: np.ndarray | None = None  # per row, the acceptance `choose` read for the coming step
        self.mode_seen: dict[tuple[int, str], int] = {}
        self._whole_since: dict[int, int] = {}  # per batch bucket: the step whole blocks became the settled mode
        self._whole_checked: dict[int, int] = {}  # per batch bucket: the step the table last said whole blocks win
        self._planned: tuple[int, str] | None = None  # what `whole_blocks` decided for the coming step
        self._best: dict[int, tuple[str, int]] = {}  # per batch bucket: the better mode and the step it became so
        self.head_wanted = True  # whether the coming step should bring the head's predictions back (`whole_blocks`)
        a = self._accept = np.linspace(0.0, 0.999, _GRID)
        lengths = np.arange(1, block + 1, dtype=np.float64)
        self._yield = (1 - a[:, None] ** lengths) / (1 - a[:, None])  # [grid, B]: E_L for each a
        self._full_block = np.ascontiguousarray(self._yield[:, -1])  # E_B, rising with a: searched per step

    def bucket(self, batch: int) -> int:
        """Batch sizes share step times by the engine's power-of-two buckets (those of its CUDA graphs),
        so continuous batching does not re-learn every size."""
        return bucket(batch, self.max_batch)

    def widths(self) -> range:
        return range(self.min_length, self.block + 1)

    def take_plan(self) -> Plan:
        """What `whole_blocks` and `drafts` decided for the step now launched, handed to its `record`. Why
        apart: an overlapped step is recorded after the next step's launch (the device need not wait for
        the bookkeeping), by when they have decided for that one."""
        plan, self._planned, self._chosen = (self._planned, self._chosen), None, None
        return plan

    @staticmethod
    def mode_of(plan: Plan) -> str | None:
        return plan[0][1] if plan[0] is not None else None

    def record(self, batch: int, width: int, seconds: float, rows: list[tuple[int, int]] | None = None,
               plan: Plan | None = None) -> None:
        """One speculative step of `batch` rows that verified `width` positions took `seconds`; `rows` are
        its (accepted drafts, verified drafts) per row, which count for the mode planned for it (`plan`,
        else the one now planned; not for a probe). Runs every step, so it only appends: medians are taken
        when the table is read."""
        bucket_ = self.bucket(batch)
        key = (bucket_, width)
        seen = self.samples.get(key)
        if seen is None:
            seen = self.samples[key] = deque(maxlen=self.window)
        seen.append(seconds)
        self._stale.add(key)
        self.steps += 1
        self.last_seen[key] = self.steps
        planned, chosen = plan if plan is not None else self.take_plan()
        if rows is None or planned is None or planned[0] != bucket_ or planned[1] == "probe":
            return
        if planned[1] == "whole":
            self._recent(self.whole_seconds, bucket_, self.window).append((self.steps, seconds))
        else:
            tokens = sum(accepted + 1 for accepted, _ in rows)
            self._recent(self.choose_steps, bucket_, self.mode_window).append(
                (self.steps, tokens, seconds, tokens + self._past_width(rows, chosen)))
        self.mode_seen[planned] = self.steps

    def _recent(self, table: dict, bucket_: int, size: int) -> deque:
        seen = table.get(bucket_)
        if seen is None:
            seen = table[bucket_] = deque(maxlen=size)
        return seen

    def _past_width(self, rows: list[tuple[int, int]], chosen: np.ndarray | None) -> float:
        """The tokens a head-read step lost to its width, expected: a row that accepted all v drafts it
        verified would have gone on accepting each further draft with its acceptance a, Σ_{j≤m} a^j for
        the m = B - 1 - v drafts left unverified."""
        if chosen is None or len(chosen) != len(rows):
            return 0.0
        lost = 0.0
        for (accepted, verified), a in zip(rows, chosen.tolist()):
            left = self.block - 1 - verified
            if accepted == verified and left > 0:
                lost += a * (1 - a ** left) / (1 - a)
        return lost

    @property
    def planned(self) -> str | None:
        """What `whole_blocks` decided for the coming step: "probe", "whole" or "choose"."""
        return self._planned[1] if self._planned is not None else None

    def mode_rate(self, batch: int, mode: str) -> float | None:
        """Tokens per second of the recent head-read steps (`mode` "choose"), or what whole blocks would
        have made of those same steps ("whole") in the median time of a recent whole-block step; None
        until each mode has had its tries.

        Recent: of the last `horizon` steps (`_head_steps`); whole-block steps strictly so. Why: the mode
        that is not the better one runs only as its retries, so its steps grow old, and a stretch when
        the machine ran faster or slower than now then decides the comparison. Step times on a shared
        2-core CPU moved by a third over minutes: a slow stretch that fell on whole-block steps kept the
        head read on every later step of a run (each dearer than a whole block), and head-read steps
        from a fast stretch took over from whole blocks that were the better mode."""
        bucket_ = self.bucket(batch)
        head = self._head_steps(bucket_)
        if head is None:
            return None
        steps = head[0]
        if mode == "choose":
            return sum(t for _, t, _, _ in steps) / max(sum(s for _, _, s, _ in steps), 1e-12)
        whole = [seconds for step, seconds in self.whole_seconds.get(bucket_, ()) if self.steps - step <= self.horizon]
        if len(whole) < self.tries:
            return None
        return sum(w for _, _, _, w in steps) / (len(steps) * max(statistics.median(whole), 1e-12))

    def _head_steps(self, bucket_: int) -> tuple[list[tuple[int, int, float, float]], bool] | None:
        """(the head-read steps a mode is weighed on, whether they are all of the last `horizon` steps):
        those of the last `horizon` steps, or, with fewer than `mode_tries` of them, the latest
        `mode_tries` however old; None before the head has had its tries."""
        kept = list(self.choose_steps.get(bucket_, ()))
        recent = [step for step in kept if self.steps - step[0] <= self.horizon]
        if len(recent) >= self.mode_tries:
            return recent, True
        return (kept[-self.mode_tries:], False) if len(kept) >= self.mode_tries else None

    def cost(self, batch: int) -> dict[int, float] | None:
        """Median step seconds per width at this batch size, once every width has its tries."""
        table, batch = {}, self.bucket(batch)
        for width in self.widths():
            key = (batch, width)
            seen = self.samples.get(key)
            if seen is None or len(seen) < self.tries:
                return None
            if key in self._stale:
                self._medians[key] = statistics.median(seen)
                self._stale.discard(key)
            table[width] = self._medians[key]
        return table

    def probe(self, batch: int) -> int | None:
        """A width to try now: the least tried of those still short of their tries (round robin, so a
        machine that speeds up or slows down meanwhile moves every width's times alike, not the last
        widths' alone), or the stalest when a re-timing is due."""
        batch = self.bucket(batch)
        counts = {width: len(self.samples.get((batch, width), ())) for width in self.widths()}
        short = [width for width, count in counts.items() if count < self.tries]
        if short:
            return min(short, key=lambda width: (counts[width], width))
        if self._retime_due(batch):
            return min(self.widths(), key=lambda w: self.last_seen.get((batch, w), 0))
        return None

    def _retime_due(self, bucket_: int) -> bool:
        """Every `refresh` steps while the head chooses; while whole blocks win, after 1, 2, 4, 8, ...
        periods of `refresh · whole_backoff` steps: such a try verifies fewer drafts than the step would,
        and on a GPU it may replay a graph no step has needed yet (captured on the clock), while the
        timings it refreshes only steer head-chosen steps."""
        if not self.refresh:
            return False
        since = self._whole_since.get(bucket_)
        if since is None:
            return self.steps % self.refresh == 0
        periods, rest = divmod(self.steps - since, self.refresh * self.whole_backoff)
        return rest == 0 and periods > 0 and periods & (periods - 1) == 0

    def whole_block_cheapest(self, batch: int) -> bool:
        """Measured, and the whole block costs at most `slack` more than the cheapest width: then it
        wins for every row, since the expected yield E_L only grows with L."""
        table = self.cost(batch)
        return table is not None and self._whole_block_wins(table)

    def _whole_block_wins(self, table: dict[int, float]) -> bool:
        return table[self.block] <= min(table.values()) * (1 + self.slack)

    def whole_blocks(self, batch: int) -> bool:
        """Whether the coming step verifies whole blocks without reading the head: no width is due for a
        timing try, and either the whole block is the cheapest width or whole-block steps have been
        yielding more tokens per second than head-chosen ones. Remembered for the next `record`.

        It runs every step, so once the table says whole blocks win it is read again only every
        `recheck` steps (its medians move slowly: each is over `window` steps)."""
        bucket_ = self.bucket(batch)
        checked = self._whole_checked.get(bucket_)
        if checked is not None and self.steps - checked < self.recheck:
            mode = "probe" if self._retime_due(bucket_) else "whole"
        elif self._inherits_whole(bucket_):
            mode = "whole"
        else:
            mode = self._decide(batch, bucket_)
        self._planned = (bucket_, mode)
        # the head's predictions are wanted on coming steps, unless the widths' times alone settle on whole
        # blocks (here, or at a larger batch this one inherits from)
        self.head_wanted = bucket_ not in self._whole_checked and (mode != "whole" or self._retry_near(bucket_))
        return mode == "whole"

    def _inherits_whole(self, bucket_: int) -> bool:
        """Whole blocks, unmeasured: a larger batch bucket has settled on them and this one has no verdict
        of its own. A smaller batch verifies fewer tokens per width, so a longer verify costs it relatively
        less and the head's cut saves less: what won at the larger batch wins here too. Why: a run's
        tail shrinks through every smaller bucket, each of which would spend its first steps on timing
        tries and head-read steps, none of them overlapped (after a warm-up that settled the largest
        batch, nearly all such steps fell in the tail's buckets)."""
        if bucket_ in self._best or bucket_ in self._whole_since or self.cost(bucket_) is not None:
            return False
        return any(larger > bucket_ for larger in self._whole_since)

    def _decide(self, batch: int, bucket_: int) -> str:
        self._whole_checked.pop(bucket_, None)
        table = self.cost(batch)
        if table is None:
            return "probe"
        if self._whole_block_wins(table):
            settled = mode = "whole"
            self._whole_checked[bucket_] = self.steps
        else:
            settled, mode = self._modes(bucket_)
        if settled == "whole":
            self._whole_since.setdefault(bucket_, self.steps)
        else:
            self._whole_since.pop(bucket_, None)
        return "probe" if self._retime_due(bucket_) else mode  # every width has had its tries (a table)

    def _modes(self, bucket_: int) -> tuple[str | None, str]:
        """(the mode whose recent steps yielded more tokens per second, None until each has had its
        tries; the mode for the coming step: each mode's tries first, the head's choice before, then
        the better one, and the other now and then, `_retry_due`)."""
        rates = {mode: self.mode_rate(bucket_, mode) for mode in ("choose", "whole")}
        for mode, rate in rates.items():
            if rate is None:  # the head's choice tried first: the whole blocks' rate is weighed on its steps
                return None, mode
        held = self._best.get(bucket_)
        # the head's choice must beat whole blocks by `margin` to take over from them: whole blocks cost
        # nothing beside DFlash, so a tie in noisy timings goes their way
        lead = 1 + self.margin if held is not None and held[0] == "whole" else 1.0
        best = "choose" if rates["choose"] > rates["whole"] * lead else "whole"
        if best == "choose" and held is not None and held[0] != best and not self._head_steps(bucket_)[1]:
            return held[0], best  # the head's steps are measured again before they take over from whole blocks
        if held is None or held[0] != best:
            held = self._best[bucket_] = (best, self.steps)
        if self._retry_due(self.steps - held[1]):
            return best, min(rates, key=lambda mode: self.mode_seen.get((bucket_, mode), 0))
        return best, best

    def _retry_near(self, bucket_: int) -> bool:
        """Whole blocks ahead: whether the head's predictions are wanted anyway. While the head's choice is the
        better mode, on every step; while whole blocks are, only on the few steps before the head's next
        retry, whose width they size (bringing them back runs the head, which a whole-block step needs not)."""
        held = self._best.get(bucket_)
        if held is None:
            return False
        if held[0] != "whole":
            return True
        return any(self._retry_due(self.steps - held[1] + ahead) for ahead in (1, 2, 3))

    def _retry_due(self, elapsed: int) -> bool:
        """The other mode's retry, ever less often while the better one holds: after ½, 1½, 3½, 7½, ...
        periods of `refresh` steps (one retry every period kept reading the head, each such step dearer
        than a whole-block one, long after the better mode was clear). Half periods keep clear of the
        width re-timings, which fall on whole periods."""
        if not self.refresh:
            return False
        periods, rest = divmod(elapsed, self.refresh)
        return rest == self.refresh // 2 and periods & (periods + 1) == 0

    def choose(self, pred: torch.Tensor, k: int) -> torch.Tensor | None:
        """Drafted tokens to verify per row (the verify width minus the pending token, the same for
        every row), at most k; None: every row verifies all k (the prediction is not read)."""
        drafts = self.drafts(pred.detach().double().cpu().numpy(), k)
        return None if drafts is None else torch.full_like(pred, drafts, dtype=torch.long)

    def drafts(self, pred: np.ndarray, k: int) -> int | None:
        """`choose` for the whole batch, from each row's predicted share of the block, in numpy: it runs
        between a step's read and the next launch, where the device waits for it (torch's per-call
        overhead made it 50 µs a step at batch 256 on a CPU)."""
        forced = self.probe(len(pred))
        if forced is not None:
            return min(forced - 1, k)
        table = self.cost(len(pred))
        assert table is not None  # probe() returns a width until every width has its tries
        if self._whole_block_wins(table):
            return None
        mean = np.clip(pred * self.block, 1.0, float(self.block))
        # a from E_B(a) = m: E_B rises with a, so the first grid point reaching m
        index = np.minimum(np.searchsorted(self._full_block, mean), _GRID - 1)
        self._chosen = self._accept[index]
        expected = self._yield[index, self.min_length - 1:].sum(0)  # [widths]: the batch's tokens
        best = int((expected / np.array([table[w] for w in self.widths()])).argmax()) + self.min_length
        return min(best - 1, k)
