"""The engine's device side: the target/drafter passes, their padding, graphs and buffers.

The Engine decides *what* to run (which rows, how many drafts, what to accept); this module
runs it on the device. On a GPU each decode pass (verify, draft, extend) is padded to a few
bucketed shapes and replayed from a CUDA graph (`GraphRunner`), because kernel launches, not
math, set the speed of a small model. Padding rows point at one scratch slot beyond
`max_batch`, so they never touch a live sequence. On CPU the passes run eagerly at their exact
shapes, where padding would cost real work.

Buffers kept per slot: the target's KV cache, the token at every position (`tokens`), the
drafter's context cache and the target features it reads (`feats`), so a hot swap can rebuild
the drafter's context without the target running again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from adaflash.engine.graphs import GraphRunner, bucket
from adaflash.engine.sampling import accept
from adaflash.engine.scripted import ScriptedAcceptance
from adaflash.models.cache import KVCache
from adaflash.models.drafters import DFlashDrafter, Drafter
from adaflash.models.invariant_attention import prefill_tiles
from adaflash.models.kernels import accept_commit, fused_accept_available
from adaflash.models.layers import greedy_ids
from adaflash.models.target import TargetModel

# Prefills replayed from graphs: widths padded to powers of two from PREFILL_MIN_WIDTH, and at most
# PREFILL_TOKENS padded positions (rows × width) a pass, which bounds what the captured graphs hold;
# wider admissions run eagerly. An eager prefill of a small model costs several decode steps: each of its
# aten calls (about 1,500 for SmolLM2) is dispatched from Python.
PREFILL_MIN_WIDTH = 32
PREFILL_TOKENS = 8192

# The length head's prediction, a ratio in (0, 1), as the integer column `draft_and_step` appends to a step's
# packed rows: one read brings the step's tokens and the next step's widths.
PREDICTION_SCALE = 1 << 16

# The length head's ratio per row, and the most drafts → how many drafts each row verifies.
# (head prediction [b], drafts per row) → verified drafts per row, or None when every row verifies all.
LengthChooser = Callable[[torch.Tensor, int], torch.Tensor | None]


class DevicePasses:
    """Device buffers of every slot, and the fixed-shape passes over them."""

    draft_cache: KVCache  # the drafter's context cache, set by install_drafter

    def __init__(self, model: TargetModel, *, max_batch: int, max_len: int,
                 cuda_graphs: bool | None = None, pad_shapes: bool | None = None) -> None:
        self.model = model
        self.device = model.device
        self.max_batch = max_batch
        self.max_len = max_len
        on_cuda = self.device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ValueError("cuda_graphs needs the target on a CUDA device")
        # Decode passes are replayed from CUDA graphs on a GPU (shapes padded to buckets);
        # on CPU they run eagerly at their exact shapes, where padding would cost real work.
        self.graphs = GraphRunner(on_cuda if cuda_graphs is None else cuda_graphs)
        self.padded = self.graphs.enabled if pad_shapes is None else pad_shapes  # the tests pad on CPU too
        if self.graphs.enabled and not self.padded:
            raise ValueError("CUDA graphs replay fixed shapes: pad_shapes cannot be off with cuda_graphs")
        # One slot beyond max_batch takes the writes of padding rows.
        self.scratch = max_batch
        self.cache = model.new_cache(max_batch + 1, max_len, static=self.graphs.enabled)
        model.rotary.fix_table(max_len + 1, model.dtype)
        self.tokens = torch.zeros(max_batch + 1, max_len + 1, dtype=torch.long, device=self.device)
        self.drafter: Drafter | None = None
        # Verify widths below the whole block replayed at their own width, not a power of two: where the
        # length head picks widths, a verify of 5 padded to 8 would cost what the whole block does.
        self.exact_widths = False
        self.script: ScriptedAcceptance | None = None  # a benchmark's scripted drafts (engine/scripted.py)
        self.capture: list[int] = []
        self.feats: torch.Tensor | None = None

    # -- drafter buffers ---------------------------------------------------------------------------
    def install_drafter(self, drafter: Drafter) -> None:
        """Move the drafter to the target's device and size its feature buffer and context cache."""
        drafter = drafter.to(device=self.device, dtype=self.model.dtype).eval()
        drafter.fuse_projections()
        drafter.bind_head(self.model, self.model.dtype)
        drafter.rotary.fix_table(self.max_len + drafter.max_draft + 2, self.model.dtype)
        self.drafter = drafter
        self.capture = list(drafter.target_layer_ids)
        width = drafter.feature_size
        if self.feats is None or self.feats.shape[-1] != width:
            length = self.max_len if self.graphs.enabled else min(self.max_len, 256)
            self.feats = torch.zeros(self.max_batch + 1, length, width, device=self.device, dtype=self.model.dtype)
        self.draft_cache = drafter.new_cache(self.max_batch + 1, self.max_len + drafter.max_draft + 2,
                                             static=self.graphs.enabled)

    def swap_drafter(self, drafter: Drafter) -> None:
        """Take the new drafter's weights; graphs survive unless its shapes differ."""
        assert self.drafter is not None
        if _same_shapes(self.drafter, drafter):
            # Copy into the running modules: captured graphs keep pointing at valid weights.
            with torch.no_grad():
                self.drafter.load_state_dict(drafter.state_dict())
                self.drafter.bind_head(self.model, self.model.dtype)
        else:
            self.graphs.clear()
            self.install_drafter(drafter)

    @torch.no_grad()
    def rebuild_draft_context(self, slots: list[int], lengths: list[int]) -> None:
        """Refill the drafter's context of these slots from the kept features and tokens.

        The context cache depends on the drafter's weights, so a swap must rebuild it.
        """
        rows = torch.tensor(slots, device=self.device)
        lens = torch.tensor(lengths, device=self.device)
        self.extend_drafter(rows, torch.zeros_like(lens), lens, 0, max(lengths), graph=False)

    def ensure_feats(self, length: int) -> None:
        """Grow the feature buffer (doubling, like the KV cache) to hold `length` positions, at most
        `max_len`: every read and write of it is clamped below that.

        A buffer already `max_len` long is never reallocated: CUDA graphs keep its address. A
        `capture_graphs` that asked for max_len + 1 would get a copy and leave every graph captured
        before it writing a freed buffer (an illegal memory access on a GPU).
        """
        assert self.feats is not None
        have = self.feats.shape[1]
        if min(length, self.max_len) > have:
            grown = min(self.max_len, max(length, 2 * have))
            extra = self.feats.new_zeros(self.feats.shape[0], grown - have, self.feats.shape[-1])
            self.feats = torch.cat([self.feats, extra], dim=1)

    # -- prefill and bookkeeping -------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor, rows: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """Target pass over new prompts: their last-token logits [b, V]; with a drafter installed, the
        features of every position go to the feature buffer.

        On padded shapes (a GPU) prompts are padded to a bucketed width and replayed from a graph when
        rows × width stays within `PREFILL_TOKENS`; otherwise (and on a CPU) the pass runs eagerly at
        its exact shape. Positions past a prompt's length write keys, values and features nothing
        reads. The features stay on the device inside the pass: a graph's outputs live as long as
        the graph, and a prompt's features are tens of megabytes.
        """
        b, width = ids.shape
        dims = self.prefill_dims(b, width)
        b_pad, w_pad = dims if dims is not None else (b, width)
        if self.drafter is not None:
            self.ensure_feats(w_pad)

        def run(ids_p: torch.Tensor, rows_p: torch.Tensor, length_p: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(w_pad, device=ids_p.device).expand(b_pad, w_pad)
            with prefill_tiles():
                logits, feats = self.model(ids_p, positions, self.cache, rows_p, capture=self.capture,
                                           logits_index=length_p - 1, kv_len=w_pad)
            self.cache.lens[rows_p] = length_p
            self.tokens[rows_p, :w_pad] = ids_p
            if feats:
                assert self.feats is not None
                self.feats[rows_p, :w_pad] = torch.cat(feats, dim=-1)
            return logits

        if dims is None:
            return run(ids, rows, length)
        logits = self.graphs.run(("prefill", b_pad, w_pad), run, [
            self._pad(ids, b_pad, w_pad), self._pad_rows(rows, b_pad), self._pad(length, b_pad, fill=1)], lane="admit")
        return logits[:b]

    def prefill_dims(self, b: int, width: int) -> tuple[int, int] | None:
        """(rows, width) a prefill is padded to and replayed at, or None: it runs eagerly, exact."""
        if not self.padded:
            return None
        b_pad, w_pad = bucket(b, self.max_batch), bucket(width, self.max_len, floor=PREFILL_MIN_WIDTH)
        return (b_pad, w_pad) if b_pad * w_pad <= PREFILL_TOKENS else None

    def prefill_positions(self, b: int, width: int) -> int:
        """Positions a prefill of `b` prompts, the longest `width` tokens, computes, padding included."""
        dims = self.prefill_dims(b, width)
        return dims[0] * dims[1] if dims is not None else b * width

    def admit(self, rows: torch.Tensor, length: torch.Tensor, first: torch.Tensor, width: int) -> None:
        """Store each prompt's first sampled token, then give the drafter the features `prefill` kept
        of the prompts (`width` wide as given to it).

        The token goes first: extending reads the token after every position.
        """
        self.tokens[rows, length] = first
        if self.drafter is not None:
            dims = self.prefill_dims(rows.shape[0], width)
            span = width if dims is None else dims[1]  # a replayed extend covers the prefill's padded width
            self.extend_drafter(rows, torch.zeros_like(length), length, 0, span, graph=dims is not None, lane="admit")

    def commit(self, rows: torch.Tensor, lens: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor,
               feats: torch.Tensor | None, longest: int) -> None:
        """Keep a verify pass's accepted positions; rejected ones roll back via the cache length."""
        if self.drafter is not None:
            self.ensure_feats(longest + emitted.shape[1])
        self._commit(rows, lens, accepted, emitted, feats)

    def _commit(self, rows: torch.Tensor, lens: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor,
                feats: torch.Tensor | None) -> None:
        """`commit` without host work, so it can run inside a replayed graph."""
        k = emitted.shape[1] - 1
        self.cache.lens[rows] = lens + accepted + 1
        # tokens[p] holds the token at position p: the accepted drafts, then the bonus token,
        # which becomes the new pending token. Writes past it are overwritten before any read.
        idx = (lens[:, None] + torch.arange(1, k + 2, device=self.device)).clamp(max=self.max_len)
        self.tokens[rows[:, None], idx] = emitted
        if self.drafter is not None and feats is not None:
            self._commit_feats(rows, lens, feats)

    def _commit_feats(self, rows: torch.Tensor, lens: torch.Tensor, feats: torch.Tensor) -> None:
        """Keep the target features [b, w, F] of positions lens..lens+w-1 (the drafter's context)."""
        assert self.feats is not None
        fidx = (lens[:, None] + torch.arange(feats.shape[1], device=self.device)).clamp(max=self.max_len - 1)
        self.feats[rows[:, None], fidx] = feats

    # -- which rows a pass runs over -------------------------------------------------------------
    def rows_for(self, slots: list[int], *, fill: bool) -> tuple[list[int], bool]:
        """The rows a decode pass runs over for live `slots` (ascending), and whether they are slots
        0..b-1 in order: then every layer reads its keys and values as views, where other rows are
        gathered (two kernels a layer).

        `fill`: the caller takes each live row's result by its slot, so on padded shapes, when every
        live slot lies below the batch's padded size, the free slots in between are the padding (a
        free slot's buffers are overwritten by its next prefill before anything reads them). At batch 32
        a batch of 28-31 live rows, the usual between admissions, then runs in order too.
        """
        b = len(slots)
        size = bucket(b, self.max_batch) if self.padded else b
        if slots == list(range(b)) and size == b:
            return slots, True
        if fill and self.padded and slots[-1] < size:
            return list(range(size)), True
        return slots, False

    @contextmanager
    def _in_order(self, on: bool) -> Iterator[None]:
        """While a pass over rows 0..b-1 runs (or is captured), the caches read them as views."""
        caches = [self.cache] + ([self.draft_cache] if self.drafter is not None else [])
        for cache in caches:
            cache.in_order = on
        try:
            yield
        finally:
            for cache in caches:
                cache.in_order = False

    def _run(self, key: tuple, fn: Callable[..., Any], inputs: list[torch.Tensor], in_order: bool,
             lane: str = "decode") -> Any:
        """Replay (or capture, or on CPU call) `fn` for `key`, its reads in order when `in_order`."""
        with self._in_order(in_order):
            return self.graphs.run((*key, in_order), fn, inputs, lane)

    # -- padding to captured shapes ----------------------------------------------------------------
    @property
    def widest(self) -> int:
        """The widest verified block: the pending token plus every draft."""
        return (self.drafter.max_draft if self.drafter is not None else 0) + 1

    def kv_bucket(self, length: int) -> int:
        return bucket(length, self.cache.max_len, floor=128) if self.padded else length

    def _dims(self, b: int, width: int, base: int, *, exact: bool = False) -> tuple[int, int, int]:
        """(batch, width, kv length) of a pass whose rows start at most at `base`.

        Padded to buckets when replaying graphs, so a few graphs serve every step; exact on CPU,
        where padding would cost real work. `exact`: a greedy step or an extend, which keep their own
        width below the whole block under `exact_widths` (a sampled verify, whose graphs hold a step's
        logits, keeps powers of two).
        """
        if not self.padded:
            return b, width, base + width
        b_pad = bucket(b, self.max_batch)
        own = exact and self.exact_widths and width <= self.widest
        w_pad = width if own else bucket(width, max(self.widest, width))
        return b_pad, w_pad, self.kv_bucket(base + w_pad)

    def _pad_rows(self, rows: torch.Tensor, size: int) -> torch.Tensor:
        if rows.shape[0] == size:
            return rows
        return torch.cat([rows, rows.new_full((size - rows.shape[0],), self.scratch)])

    @staticmethod
    def _pad(x: torch.Tensor, b: int, width: int | None = None, fill: int = 0) -> torch.Tensor:
        """Pad dim 0 to b (and dim 1 to width) with `fill`."""
        shape = [b, *x.shape[1:]]
        if width is not None:
            shape[1] = width
        if list(x.shape) == shape:
            return x
        out = x.new_full(shape, fill)
        if x.dim() > 1:
            out[: x.shape[0], : x.shape[1]] = x
        else:
            out[: x.shape[0]] = x
        return out

    def _positions(self, start: torch.Tensor, b: int, width: int) -> torch.Tensor:
        """start + 0..width-1 per row; padding rows count from 0 in the scratch slot."""
        return self._pad(start, b)[:, None] + torch.arange(width, device=self.device)

    # -- the passes --------------------------------------------------------------------------------
    def extend_drafter(self, rows: torch.Tensor, start: torch.Tensor, count: torch.Tensor, base: int,
                       width: int, *, graph: bool = True, in_order: bool = False, lane: str = "decode") -> None:
        """Give the drafter the target features of positions [start, start + count) per row.

        `base` >= every start and `width` >= every count are host-side bounds. `graph=False` runs
        eagerly (prefill and hot swap, whose widths are prompt lengths, each a shape of its own).
        `in_order`: the rows are slots 0..b-1 (`rows_for`), here and in the passes below. `lane`: the
        graphs' memory pool (`GraphRunner`); an admission's extend is in the admissions' lane.
        """
        assert self.drafter is not None and self.feats is not None
        b = rows.shape[0]
        b_pad, w_pad, kv = self._dims(b, width, base, exact=True) if graph else (b, width, base + width)
        rows_p = self._pad_rows(rows, b_pad)
        positions = self._positions(start, b_pad, w_pad)
        inputs = [rows_p, positions, *self._context_inputs(rows_p, positions), self._pad(count, b_pad, fill=1)]
        drafter, cache, model = self.drafter, self.draft_cache, self.model

        def extend(rows_p, positions, feats, next_tokens, count_p):
            drafter.extend(cache, rows_p, positions, feats, next_tokens, count_p, model, kv)

        if graph:
            self._run(("extend", b_pad, w_pad, kv), extend, inputs, in_order, lane)
        else:
            extend(*inputs)
        self.draft_cache.lens[rows] = start + count

    def _context_inputs(self, rows: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the drafter's context reads at `positions`: the target features there, and the
        token after each (the bonus token after the last accepted one)."""
        assert self.feats is not None
        safe = positions.clamp(max=self.feats.shape[1] - 1)
        return self.feats[rows[:, None], safe], self.tokens[rows[:, None], safe + 1]

    def verify(self, rows: torch.Tensor, block: torch.Tensor, lens: torch.Tensor, longest: int, *,
               greedy: bool = False, in_order: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Target pass over [pending, drafts] at each row's positions, and the drafter's features.

        Returns logits [b, w, V], or with `greedy` the target's argmax tokens [b, w], taken inside
        the replayed graph: no logits leave it (at batch 32, 3 MB a step not copied).
        """
        b, width = block.shape
        b_pad, w_pad, kv = self._dims(b, width, longest)
        rows_p = self._pad_rows(rows, b_pad)
        positions = self._positions(lens, b_pad, w_pad)
        model, cache, capture = self.model, self.cache, self.capture

        def verify(block_p, positions, rows_p):
            logits, feats = model(block_p, positions, cache, rows_p, capture=capture, kv_len=kv)
            return greedy_ids(logits) if greedy else logits, (torch.cat(feats, dim=-1) if feats else None)

        out, feats = self._run(("verify", b_pad, w_pad, kv, greedy), verify,
                               [self._pad(block, b_pad, w_pad), positions, rows_p], in_order)
        return out[:b, :width], (feats[:b, :width] if feats is not None else None)

    def draft(self, rows: torch.Tensor, pending: torch.Tensor, lens: torch.Tensor, longest: int, *,
              steps: int | None, choose: LengthChooser | None,
              in_order: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft tokens [b, K] and how many of them each row verifies [b].

        `steps` drafts per row (None: the drafter's own); `choose`, when given, turns the length
        head's prediction into per-row verify lengths.
        """
        b = rows.shape[0]
        drafter = self.drafter
        if drafter is None:
            return torch.zeros(b, 0, dtype=torch.long, device=self.device), torch.zeros(b, dtype=torch.long, device=self.device)
        if choose is not None and not self.padded and isinstance(drafter, DFlashDrafter) \
                and drafter.length_head is not None and self.script is None:
            # Eager (CPU): run the block, let the head choose, then pay lm_head only for what is verified.
            hidden = drafter.block_hidden(self.draft_cache, rows, pending, lens, self.model, longest)
            verify_n = choose(drafter.predict_length(hidden), drafter.max_draft)
            if verify_n is None:
                verify_n = torch.full((b,), drafter.max_draft, dtype=torch.long, device=self.device)
            return drafter.tokens(hidden, int(verify_n.max()), self.model), verify_n
        b_pad = self._dims(b, 1, longest)[0]
        ctx = self.kv_bucket(longest)
        cache, model, predict = self.draft_cache, self.model, choose is not None

        def draft(rows_p, pending_p, lens_p):
            out = drafter.draft(cache, rows_p, pending_p, lens_p, model, ctx, steps=steps, predict_length=predict)
            return out if self.script is None else self.script.apply(*out, rows_p, lens_p)

        # Without a chooser the head's prediction is not read, so its graph leaves the head out.
        drafts, length_pred = self._run(
            ("draft", b_pad, ctx, steps, predict), draft,
            [self._pad_rows(rows, b_pad), self._pad(pending, b_pad), self._pad(lens, b_pad)], in_order)
        drafts = drafts[:b]
        k = drafts.shape[1]
        verify_n = choose(length_pred[:b], k) if choose is not None and length_pred is not None else None
        if verify_n is not None:
            return drafts[:, : int(verify_n.max())], verify_n
        return drafts, torch.full((b,), k, dtype=torch.long, device=self.device)


    def greedy_step(self, rows: torch.Tensor, pending: torch.Tensor, drafts: torch.Tensor, verify_n: torch.Tensor,
                    lens: torch.Tensor, longest: int, *, in_order: bool = False) -> torch.Tensor:
        """A greedy decode step after drafting, as ONE replayed pass: verify, accept, commit, extend.

        Returns [b, 2 + w]: per row the accepted draft count, the verified count, then the
        accepted drafts with the bonus token (the target's own token after them) at column
        2 + accepted. On a GPU the host launches one graph and reads one small tensor, where the
        unfused step ran some forty small eager ops around three graphs: at batch 1 those
        launches, not the math, are what a speculative step costs more than a Vanilla one.
        """
        b, width = rows.shape[0], drafts.shape[1] + 1
        b_pad, w_pad, kv = self._dims(b, width, longest, exact=True)
        if self.drafter is not None:
            self.ensure_feats(longest + w_pad + 1)
        self.cache.reserve(kv)
        block = torch.cat([pending[:, None], drafts], dim=1)
        inputs = [self._pad_rows(rows, b_pad), self._pad(block, b_pad, w_pad), self._pad(lens, b_pad),
                  self._pad(verify_n, b_pad)]
        out = self._run(("greedy_step", b_pad, w_pad, kv), self._greedy_step_fn(kv), inputs, in_order)
        return out[:b]

    def draft_and_step(self, rows: torch.Tensor, pending: torch.Tensor, lens: torch.Tensor, longest: int, *,
                       steps: int | None, predict: bool = False, in_order: bool = False) -> torch.Tensor:
        """Draft a block and take `greedy_step` on all of it, as ONE replayed pass; returns what
        `greedy_step` does, and with `predict` one column more: the length head's prediction for the
        block, times `PREDICTION_SCALE` (read with the step's tokens, it sizes the next step's verify).

        For greedy rows that verify every draft: DFlash, OSD, EAGLE-3, MTP, and AdaFlash under its
        cost rule, which sets `steps` for the whole batch. At batch 1 a step is bound by launches and
        host work, so the drafts stay on the device and the host launches one graph where it launched
        two with a dozen small copies, pads and concatenations around them.
        """
        assert self.drafter is not None
        b, k = rows.shape[0], steps or self.drafter.max_draft
        predict = predict and self.drafter.predicts_length
        b_pad, w_pad, kv = self._dims(b, k + 1, longest, exact=True)
        ctx = self.kv_bucket(longest)
        self.ensure_feats(longest + w_pad + 1)
        self.cache.reserve(kv)
        drafter, cache, model, step = self.drafter, self.draft_cache, self.model, self._greedy_step_fn(kv)

        def fused(rows_p: torch.Tensor, pending_p: torch.Tensor, lens_p: torch.Tensor) -> torch.Tensor:
            drafts, pred = drafter.draft(cache, rows_p, pending_p, lens_p, model, ctx, steps=k, predict_length=predict)
            if self.script is not None:
                drafts, pred = self.script.apply(drafts, pred, rows_p, lens_p)
            block = torch.nn.functional.pad(torch.cat([pending_p[:, None], drafts], dim=1), (0, w_pad - k - 1))
            # Every draft is verified: accept need not mask, unless the block carries padding columns.
            verify_n = None if w_pad == k + 1 else torch.full_like(lens_p, k)
            packed = step(rows_p, block, lens_p, verify_n, verified=k)
            if pred is None:
                return packed
            return torch.cat([packed, (pred.float() * PREDICTION_SCALE).round().long()[:, None]], dim=1)

        out = self._run(("draft_and_step", b_pad, w_pad, kv, ctx, k, predict), fused,
                        [self._pad_rows(rows, b_pad), self._pad(pending, b_pad), self._pad(lens, b_pad)], in_order)
        return out[:b]

    def _greedy_step_fn(self, kv: int) -> Callable[..., torch.Tensor]:
        model, cache, capture, drafter = self.model, self.cache, self.capture, self.drafter

        def step(rows_p: torch.Tensor, block_p: torch.Tensor, lens_p: torch.Tensor,
                 verify_n_p: torch.Tensor | None, verified: int = 0) -> torch.Tensor:
            """`verify_n_p` per row, or None: every row verifies all `verified` drafts of the block."""
            w = block_p.shape[1]
            positions = lens_p[:, None] + torch.arange(w, device=lens_p.device)
            logits, feats = model(block_p, positions, cache, rows_p, capture=capture, kv_len=kv)
            posterior = greedy_ids(logits)
            features = torch.cat(feats, dim=-1) if feats else None
            draft_lens = self.draft_cache.lens if drafter is not None else None
            if fused_accept_available(block_p):  # acceptance, token and length writes: one kernel
                packed = accept_commit(block_p, posterior, lens_p, rows_p, verify_n_p, verified, self.tokens,
                                       self.cache.lens, draft_lens)
                if features is not None:
                    self._commit_feats(rows_p, lens_p, features)
            else:
                accepted, emitted = accept(block_p[:, 1:], posterior, verify_n_p)
                self._commit(rows_p, lens_p, accepted, emitted, features)
                if draft_lens is not None:
                    draft_lens[rows_p] = lens_p + accepted + 1
                counts = verify_n_p if verify_n_p is not None else torch.full_like(accepted, verified)
                packed = torch.cat([accepted[:, None], counts[:, None], emitted], dim=1)
            if drafter is not None:
                # The drafter's context gains the accepted positions and the bonus position: their
                # features and next tokens are this pass's own, where `_context_inputs` would read back
                # what the commit just stored (four kernels more, the same values for every kept position).
                drafter.extend(self.draft_cache, rows_p, positions, features, packed[:, 2:], packed[:, 0] + 1,
                               model, kv)
            return packed

        return step

def _same_shapes(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].shape == sb[k].shape for k in sa)
