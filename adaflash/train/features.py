"""Target features for training: the hidden states a drafter reads, and teacher logits where asked."""

from __future__ import annotations

from collections.abc import Callable

import torch

from adaflash.models.target import TargetModel

# (ids [b, S], lens [b], with_last) -> (features [b, S, n·H], last layer [b, S, H] or None)
FeatureSource = Callable[[torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]


def direct_features(target: TargetModel, layer_ids: list[int]) -> FeatureSource:
    """Features computed from scratch for each batch (on-policy rows are seen once)."""
    return lambda ids, lens, with_last: target_features(target, ids, layer_ids, with_last=with_last)


@torch.no_grad()
def target_features(target: TargetModel, ids: torch.Tensor, layer_ids: list[int],
                    with_last: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenated features [b, S, n·H] of `layer_ids`, and optionally the last layer's output [b, S, H]."""
    capture = list(layer_ids)
    last = target.cfg.num_hidden_layers - 1
    if with_last and last not in capture:
        capture.append(last)
    captured = target.hidden_states(ids, capture)
    feats = torch.cat(captured[: len(layer_ids)], dim=-1)
    final = captured[capture.index(last)] if with_last else None
    return feats, final


@torch.no_grad()
def teacher_logits(target: TargetModel, final_hidden: torch.Tensor, rows: torch.Tensor,
                   positions: torch.Tensor) -> torch.Tensor:
    """The target's logits at (rows, positions): its prediction for the token after each position."""
    return target.logits(final_hidden[rows, positions])


class FeatureMemo:
    """Target features per training sequence, computed once and reused by every later epoch.

    Offline training revisits the same sequences many times and the target pass is most of a
    CPU step. Features of a position depend only on the tokens up to it (causal attention), so
    a sequence's features do not depend on the batch it was padded into. Past `budget_bytes`
    the memo stops storing and features are computed per batch as before.
    """

    def __init__(self, target: TargetModel, layer_ids: list[int], budget_bytes: float | None = None,
                 keep_greedy: bool = False, store_dtype: torch.dtype | None = None) -> None:
        self.target = target
        self.layer_ids = list(layer_ids)
        self.budget = default_budget(next(target.parameters()).device) if budget_bytes is None else budget_bytes
        # Under bf16 autocast the drafter's first use of a feature is a matmul that rounds it to bf16
        # anyway (DFlash's and EAGLE-3's fc), so storing it rounded changes no bit there and keeps
        # twice the sequences within the budget (MTP's norm then reads the bf16 values inference has).
        # The last layer's output (teacher logits, through the final norm) stays as computed.
        self.store_dtype = store_dtype
        self.used = 0
        # Over budget, the last batch's greedy tokens, from the one target pass that made its features.
        self.batch_greedy: tuple[list[int], torch.Tensor] | None = None
        self.store: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        # The target's greedy next token at every position, kept when only its argmax is needed
        # (CE training of a length head): the full lm_head then runs once per sequence, not per step.
        self.keep_greedy = keep_greedy
        self.greedy_ids: dict[int, torch.Tensor] = {}

    def source(self, keys: list[int]) -> MemoSource:
        """The feature source of one padded batch whose rows are the sequences `keys`."""
        return MemoSource(self, keys)

    def features(self, keys: list[int], ids: torch.Tensor, lens: torch.Tensor,
                 with_last: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Features of the padded batch `ids` whose rows are the sequences `keys`."""
        missing = [i for i, k in enumerate(keys) if k not in self.store or (with_last and self.store[k][1] is None)]
        if missing and self.used > self.budget:
            feats, final = target_features(self.target, ids, self.layer_ids, with_last=with_last or self.keep_greedy)
            if self.keep_greedy and final is not None:
                self.batch_greedy = (list(keys), greedy_tokens(self.target, final.flatten(0, 1)).view(ids.shape))
            return feats, final if with_last else None
        if missing:
            sizes = lens.tolist()  # one sync, not one a row
            width = max(sizes[i] for i in missing)
            need_last = with_last or self.keep_greedy
            feats, final = target_features(self.target, ids[missing, :width], self.layer_ids, with_last=need_last)
            greedy = greedy_tokens(self.target, final.flatten(0, 1)).view(len(missing), width) \
                if self.keep_greedy and final is not None else None  # the whole batch at once
            for j, i in enumerate(missing):
                n = sizes[i]
                entry = (self._kept(feats[j, :n]), final[j, :n].clone() if with_last and final is not None else None)
                self.store[keys[i]] = entry
                self.used += sum(t.numel() * t.element_size() for t in entry if t is not None)
                if greedy is not None:
                    self.greedy_ids[keys[i]] = greedy[j, :n].clone()
        width = ids.shape[1]
        entries = [self.store[k] for k in keys]
        out = stack_padded([f for f, _ in entries], width)
        last = stack_padded([h for _, h in entries], width) if with_last else None  # type: ignore[misc]
        return out, last

    def _kept(self, feats: torch.Tensor) -> torch.Tensor:
        return feats.to(self.store_dtype, copy=True) if self.store_dtype is not None else feats.clone()

    def greedy(self, keys: list[int], ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """[b, width] the target's greedy next token after each position of the padded batch."""
        if self.batch_greedy is not None and self.batch_greedy[0] == list(keys):
            return self.batch_greedy[1]
        if any(k not in self.greedy_ids for k in keys):  # not kept (over budget, or asked late)
            _, final = target_features(self.target, ids, self.layer_ids, with_last=True)
            assert final is not None
            return greedy_tokens(self.target, final.flatten(0, 1)).view(ids.shape)
        return stack_padded([self.greedy_ids[k] for k in keys], ids.shape[1])


def stack_padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """[b, width, ...] of rows [n_i, ...] (n_i <= width), zeros after each: one cat and one scatter
    instead of a copy a row (a step of a GPU trainer is short enough that those showed)."""
    lens = torch.tensor([r.shape[0] for r in rows])
    with torch.autocast(rows[0].device.type, enabled=False):  # a copy: no dtype to choose (CPU autocast refuses fp16)
        flat = torch.cat(rows)
    out = flat.new_zeros(len(rows) * width, *flat.shape[1:])
    where = (torch.arange(len(rows))[:, None] * width + torch.arange(width)[None, :])[
        torch.arange(width)[None, :] < lens[:, None]]
    out.index_copy_(0, where.to(flat.device), flat)
    return out.view(len(rows), width, *flat.shape[1:])


class MemoSource:
    """A FeatureSource bound to one batch's sequences, which can also give the target's greedy tokens."""

    def __init__(self, memo: FeatureMemo, keys: list[int]) -> None:
        self.memo, self.keys = memo, keys

    def __call__(self, ids: torch.Tensor, lens: torch.Tensor, with_last: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.memo.features(self.keys, ids, lens, with_last)

    def greedy(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        return self.memo.greedy(self.keys, ids, lens)


def default_budget(device: torch.device) -> float:
    """How many bytes of features to keep: 4 GB on a CPU, a third of what is free on a GPU.

    A GPU holds a whole GSM8K-sized set (about 6 GB for five SmolLM2 layers in bf16); past the
    budget each batch pays a full target pass again.
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free / 3
    return 4e9


GREEDY_ROWS = {"cpu": 256, "cuda": 4096}  # positions whose logits [rows, V] exist at once


@torch.no_grad()
def greedy_tokens(target: TargetModel, final_hidden: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """argmax of the target's logits at each position of [n, H] (chunked: [chunk, V] at a time).

    A GPU takes 4,096 positions a chunk (400 MB of bf16 logits for a 49,152-token vocabulary): in 256-row
    chunks a batch of 32,768 fresh tokens costs 128 norm + lm_head + argmax launches, and the host
    launching them, not the GPU, then sets the pace of a training step (`train draft --profile` shows it).
    """
    chunk = chunk or GREEDY_ROWS.get(final_hidden.device.type, 256)
    return torch.cat([target.logits(final_hidden[i : i + chunk]).argmax(-1)
                      for i in range(0, final_hidden.shape[0], chunk)])
