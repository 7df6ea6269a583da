"""Drafters: the DFlash block-diffusion drafter (with the AdaFlash length head) and the chain
drafters (EAGLE-3, MTP). All reuse the target's frozen embedding and lm_head.

Two families, one engine interface:
  * block (DFlash/AdaFlash): `[pending, MASK × (B-1)]` drafted in ONE pass; target features of
    the context are fused (fc + RMSNorm) and injected as extra keys/values into every layer;
    attention inside the block is bidirectional.
  * chain (EAGLE-3, MTP): one layer run autoregressively; drafter position p reads the pair
    (feature_p, token_{p+1}) and predicts token_{p+2}; later steps feed back their own hidden.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from adaflash.models.cache import KVCache
from adaflash.models.layers import (
    MLP,
    Attention,
    DecoderConfig,
    DecoderLayer,
    Linear,
    RMSNorm,
    Rotary,
    greedy_ids,
    linear,
)
from adaflash.models.length_head import LengthHead
from adaflash.models.target import TargetModel, causal_mask


class Drafter(nn.Module):
    kind: str = ""
    method: str = ""

    def __init__(self, cfg: DecoderConfig, target_layer_ids: list[int], block_size: int,
                 draft_vocab_size: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.target_layer_ids = list(target_layer_ids)
        self.block_size = block_size
        self.rotary = Rotary(cfg)
        # A draft vocabulary (EAGLE-3's d2t idea): the drafter scores only the N most frequent
        # target tokens. The head is the target's lm_head rows of those tokens, so nothing new is
        # learned, but drafting and training cost N/V of the full head: on a CPU, most of a draft.
        self.draft_vocab: torch.Tensor | None
        if draft_vocab_size:
            self.register_buffer("draft_vocab", torch.arange(draft_vocab_size))
        else:
            self.draft_vocab = None
        self.head_weight: torch.Tensor | None = None

    def set_draft_vocab(self, vocab: torch.Tensor) -> None:
        """Score these target ids from now on. No weight depends on the vocabulary (the head is the
        target's rows), so a trained drafter can be given a wider one and learn the new tokens."""
        self._buffers.pop("draft_vocab", None)
        self.__dict__.pop("draft_vocab", None)  # the plain None a whole-vocabulary drafter holds
        self.register_buffer("draft_vocab", vocab.to(dtype=torch.long, device=next(self.parameters()).device).clone())
        self.head_weight = None

    def fuse_projections(self) -> None:
        """q/k/v and gate/up as one GEMM each in every layer, as the target's (`TargetModel.fuse_projections`).

        Frozen inference only, after the last dtype or device change: the engine calls it when it installs
        a drafter. The state_dict is unchanged, so a hot swap's `load_state_dict` fills the fused weights.
        """
        for module in self.modules():
            if isinstance(module, (Attention, MLP)):
                module.fuse()

    @property
    def draft_vocab_size(self) -> int | None:
        return None if self.draft_vocab is None else int(self.draft_vocab.shape[0])

    def bind_head(self, target: TargetModel, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """(Re)build the draft head from the target; in place when the shape allows (graphs keep it)."""
        if self.draft_vocab is None:
            self.head_weight = None
            return None
        weight = target.lm_head.weight.detach()[self.draft_vocab.to(target.lm_head.weight.device)]
        weight = weight.to(device=self.draft_vocab.device, dtype=dtype or weight.dtype)
        old = self.head_weight
        if old is not None and old.shape == weight.shape and old.dtype == weight.dtype and old.device == weight.device:
            old.copy_(weight)
        else:
            self.head_weight = weight
        return self.head_weight

    def draft_logits(self, hidden: torch.Tensor, target: TargetModel) -> torch.Tensor:
        """Scores over the draft vocabulary (the whole target vocabulary without one)."""
        if self.draft_vocab is None:
            return target.lm_head(hidden)
        weight = self.head_weight
        if weight is None or weight.dtype != hidden.dtype or weight.device != hidden.device:
            weight = self.bind_head(target, hidden.dtype)
        return linear(hidden, weight)

    def to_target_ids(self, index: torch.Tensor) -> torch.Tensor:
        return index if self.draft_vocab is None else self.draft_vocab[index]

    @property
    def feature_size(self) -> int:
        return len(self.target_layer_ids) * self.cfg.hidden_size

    @property
    def max_draft(self) -> int:
        return self.block_size - 1

    @property
    def predicts_length(self) -> bool:
        """Whether `draft` can return a predicted acceptance ratio (an AdaFlash length head)."""
        return False

    def new_cache(self, slots: int, max_len: int, *, static: bool = False) -> KVCache:
        p = next(self.parameters())
        return KVCache(self.num_cache_layers, slots, max_len, self.cfg.num_key_value_heads, self.cfg.head_dim,
                       device=p.device, dtype=p.dtype, static=static)

    @property
    def num_cache_layers(self) -> int:
        raise NotImplementedError

    def extend(self, cache: KVCache, rows: torch.Tensor, positions: torch.Tensor, feats: torch.Tensor,
               next_tokens: torch.Tensor, count: torch.Tensor, target: TargetModel, kv_len: int) -> None:
        """Add context positions [b, w] (their target features and next tokens); kv_len > positions."""
        raise NotImplementedError

    def draft(self, cache: KVCache, rows: torch.Tensor, pending: torch.Tensor, lens: torch.Tensor,
              target: TargetModel, ctx_len: int, steps: int | None = None,
              predict_length: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft `steps` (default max_draft) tokens after `pending`; ctx_len >= every row's length.

        Returns (drafts [b, steps], predicted acceptance ratio [b] or None: no length head, or
        `predict_length` False because nobody will read it). Sizes come from the
        host so the call never waits on the device and can be replayed as a CUDA graph.
        """
        raise NotImplementedError


class DFlashDrafter(Drafter):
    kind = "block"
    method = "dflash"

    def __init__(self, cfg: DecoderConfig, target_layer_ids: list[int], block_size: int = 16,
                 mask_token_id: int | None = None, length_head: bool = False, length_head_width: int = 256,
                 draft_vocab_size: int | None = None) -> None:
        super().__init__(cfg, target_layer_ids, block_size, draft_vocab_size)
        hidden = cfg.hidden_size
        self.mask_token_id = mask_token_id
        self.fc = Linear(len(target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(hidden, cfg.rms_norm_eps)
        if mask_token_id is None:
            self.mask_embedding = nn.Parameter(torch.randn(hidden) * 0.02)
        self.length_head = LengthHead(hidden, length_head_width) if length_head else None

    @property
    def predicts_length(self) -> bool:
        return self.length_head is not None

    @property
    def num_cache_layers(self) -> int:
        return len(self.layers)

    def deepen(self, layers: int) -> None:
        """Grow to `layers` layers, each new one a copy of the last with its attention and MLP outputs
        zeroed: a residual that adds nothing, so the drafter drafts exactly as before and training
        gives the new layers their work (their output projections get gradients from the first step)."""
        if layers < len(self.layers):
            raise ValueError(f"the drafter has {len(self.layers)} layers; it can be deepened, not cut to {layers}")
        for _ in range(layers - len(self.layers)):
            layer = copy.deepcopy(self.layers[-1])
            nn.init.zeros_(layer.self_attn.o_proj.weight)
            nn.init.zeros_(layer.mlp.down_proj.weight)
            self.layers.append(layer)
        self.cfg = dataclasses.replace(self.cfg, num_hidden_layers=len(self.layers))

    def context(self, feats: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(feats))

    def mask_embeds(self, target: TargetModel, shape: tuple[int, ...]) -> torch.Tensor:
        if self.mask_token_id is None:
            return self.mask_embedding.expand(*shape, -1)
        token = torch.full(shape, self.mask_token_id, dtype=torch.long, device=self.fc.weight.device)
        return target.embed(token)

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor,
                   bound: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values of context positions in every layer (`bound`: as `Rotary` takes it)."""
        rope = self.rotary(positions, ctx.dtype, bound)
        return [layer.self_attn.project_kv(ctx, rope) for layer in self.layers]

    def run_block(self, h: torch.Tensor, positions: torch.Tensor,
                  ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor,
                  bound: int | None = None) -> torch.Tensor:
        """Block queries over [context keys, block keys]; mask [b, q, ctx + q]. Returns normed hidden."""
        rope = self.rotary(positions, h.dtype, bound)
        for layer, (k_ctx, v_ctx) in zip(self.layers, ctx_kv):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q, k, v = attn.project_qkv(x, rope)
            h = h + attn.attend(q, torch.cat([k_ctx, k], 1), torch.cat([v_ctx, v], 1), mask)
            h = layer.mlp_block(h)
        return self.norm(h)

    def extend(self, cache, rows, positions, feats, next_tokens, count, target, kv_len) -> None:
        cache.reserve(kv_len)
        ctx = self.context(feats.to(self.fc.weight.dtype))
        where = cache.where(rows, positions)
        rope = self.rotary(positions, ctx.dtype, kv_len)
        for index, layer in enumerate(self.layers):
            layer.self_attn.caching_kv(ctx, rope, cache, index, where)

    def block_hidden(self, cache: KVCache, rows: torch.Tensor, pending: torch.Tensor, lens: torch.Tensor,
                     target: TargetModel, ctx_len: int) -> torch.Tensor:
        """The normed hidden states of `[pending, MASK x (B-1)]` after each row's context.

        The block's keys and values go into the cache right after each row's context (positions
        lens..lens+B-1, which hold no context yet: the next `extend` overwrites the accepted ones), so
        each layer attends over one cache view with keys below lens + B visible, where concatenating
        the context's keys with the block's copied the whole context twice a layer (two copy kernels
        a layer in every draft, growing with the context).
        """
        b, size = pending.shape[0], self.block_size
        h = torch.cat([target.embed(pending)[:, None], self.mask_embeds(target, (b, size - 1))], dim=1)
        positions = lens[:, None] + torch.arange(size, device=lens.device)
        kv_len = ctx_len + size
        cache.reserve(kv_len)
        where = cache.where(rows, positions)
        visible = torch.arange(kv_len, device=lens.device)[None, None, :] < (lens + size)[:, None, None]
        mask = visible.expand(b, size, kv_len)
        rope = self.rotary(positions, h.dtype, kv_len)
        for index, layer in enumerate(self.layers):
            h = layer.cached(h, rope, mask, cache, index, where, rows, kv_len)
        return self.norm(h)

    def predict_length(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.length_head(hidden) if self.length_head is not None else None

    def tokens(self, hidden: torch.Tensor, count: int, target: TargetModel) -> torch.Tensor:
        """Greedy draft tokens of the first `count` masked positions: lm_head only where needed."""
        return self.to_target_ids(greedy_ids(self.draft_logits(hidden[:, 1 : 1 + count], target)))

    def draft(self, cache, rows, pending, lens, target, ctx_len, steps=None, predict_length=True):
        hidden = self.block_hidden(cache, rows, pending, lens, target, ctx_len)
        return self.tokens(hidden, steps or self.max_draft, target), self.predict_length(hidden) if predict_length else None


class ChainDrafter(Drafter):
    """EAGLE-3 (fused low/mid/high features) or MTP (last hidden state), drafting a chain."""

    kind = "chain"

    def __init__(self, cfg: DecoderConfig, target_layer_ids: list[int], method: str, steps: int = 6,
                 draft_vocab_size: int | None = None) -> None:
        super().__init__(cfg, target_layer_ids, steps + 1, draft_vocab_size)
        hidden = cfg.hidden_size
        self.method = method
        if method == "eagle3":
            self.fc = Linear(len(target_layer_ids) * hidden, hidden, bias=False)
            self.midlayer = DecoderLayer(cfg, attn_in_features=2 * hidden)
        elif method == "mtp":
            if len(target_layer_ids) != 1:
                raise ValueError("an MTP module reads exactly one target layer (the last)")
            self.enorm = RMSNorm(hidden, cfg.rms_norm_eps)
            self.hnorm = RMSNorm(hidden, cfg.rms_norm_eps)
            self.eh_proj = Linear(2 * hidden, hidden, bias=False)
            self.midlayer = DecoderLayer(cfg)
        else:
            raise ValueError(f"unknown chain drafter method {method!r}")
        self.norm = RMSNorm(hidden, cfg.rms_norm_eps)

    @property
    def num_cache_layers(self) -> int:
        return 1

    def new_cache(self, slots: int, max_len: int, *, static: bool = False) -> KVCache:
        cache = super().new_cache(slots, max_len, static=static)
        p = next(self.parameters())
        cache.last_hidden = torch.zeros(slots, self.cfg.hidden_size, device=p.device, dtype=p.dtype)  # type: ignore[attr-defined]
        return cache

    def fuse(self, emb: torch.Tensor, g: torch.Tensor, from_target: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(layer input, residual) from the next token's embedding and a feature / own hidden."""
        if self.method == "eagle3":
            if from_target:
                g = self.fc(g)
            return torch.cat([emb, g], dim=-1), g
        u = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(g)], dim=-1))
        return u, u

    def qkv(self, u: torch.Tensor, positions: torch.Tensor,
            bound: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layer = self.midlayer
        rope = self.rotary(positions, u.dtype, bound)
        x = layer.input_layernorm(u)
        return layer.self_attn.project_qkv(x, rope)

    def attend_mlp(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, resid: torch.Tensor,
                   mask: torch.Tensor) -> torch.Tensor:
        h = resid + self.midlayer.self_attn.attend(q, keys, values, mask)
        return self.midlayer.mlp_block(h)

    def layer(self, u: torch.Tensor, resid: torch.Tensor, positions: torch.Tensor, cache: KVCache,
              rows: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One cached pass: these positions' keys join the cache, queries see it causally."""
        q, k, v = self.qkv(u, positions, bound=kv_len)
        cache.write(0, cache.where(rows, positions), k, v)
        keys, values = cache.read(0, rows, kv_len)
        return self.attend_mlp(q, keys, values, resid, causal_mask(positions, kv_len))

    def extend(self, cache, rows, positions, feats, next_tokens, count, target, kv_len) -> None:
        cache.reserve(kv_len)
        u, resid = self.fuse(target.embed(next_tokens), feats.to(self.norm.weight.dtype), from_target=True)
        h = self.layer(u, resid, positions, cache, rows, kv_len)
        last = h[torch.arange(h.shape[0], device=h.device), count - 1]
        cache.last_hidden[rows] = last

    def draft(self, cache, rows, pending, lens, target, ctx_len, steps=None, predict_length=True):
        steps = steps or self.max_draft
        cache.reserve(ctx_len + steps)
        h = cache.last_hidden[rows]
        token = self.to_target_ids(greedy_ids(self.draft_logits(self.norm(h), target)))
        drafts = [token]
        for t in range(1, steps):
            positions = (lens + t - 1)[:, None]
            u, resid = self.fuse(target.embed(token)[:, None], h[:, None], from_target=False)
            h = self.layer(u, resid, positions, cache, rows, ctx_len + t)[:, 0]
            token = self.to_target_ids(greedy_ids(self.draft_logits(self.norm(h), target)))
            drafts.append(token)
        return torch.stack(drafts, dim=1), None
