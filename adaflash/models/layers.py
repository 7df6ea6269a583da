"""Decoder building blocks of the Llama / Qwen2 / Qwen3 family, shared by the target and the drafters.

Parameter names follow Hugging Face's so checkpoints load without renaming.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adaflash.models import invariant, invariant_attention
from adaflash.models.cache import KVCache
from adaflash.models.cpu_attention import cpu_row_invariant_attention
from adaflash.models.cpu_flags import bf16_row_chunk, cpu_flags
from adaflash.models.kernels import fused_rope_available, rope_heads, silu_mul


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """The argmax token of each row of `logits` [..., V].

    On a CPU, bf16/fp16 logits are widened first: torch's CPU argmax has no vectorized half-precision
    path, so widened it runs several times faster. Widening is exact and argmax keeps the first of equal
    maxima either way: the same ids.
    """
    if logits.device.type == "cpu" and logits.dtype in (torch.bfloat16, torch.float16):
        return logits.float().argmax(-1)
    return logits.argmax(-1)


@dataclass
class DecoderConfig:
    """The subset of a HF decoder config that the math needs."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> DecoderConfig:
        model_type = cfg.get("model_type", "llama")
        text = cfg.get("text_config") or {}
        cfg = {**text, **{k: v for k, v in cfg.items() if k != "text_config"}} if text else cfg
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0
        scaling = rope if rope.get("rope_type", rope.get("type", "default")) not in ("default", None) else None
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type in ("qwen3", "qwen3_moe") or bool(cfg.get("qk_norm", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            model_type=model_type,
        )

    def to_hf(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
        }
        if self.rope_scaling:
            out["rope_scaling"] = self.rope_scaling
        return out


_ROWS_KEEP_BITS: ContextVar[bool] = ContextVar("rows_keep_bits", default=False)


@contextmanager
def rows_keep_bits(on: bool = True) -> Iterator[None]:
    """Within it, CPU products and attention give each row the bits it gets in any other batch (`linear`,
    `Attention.attend`): the target's decode and verify passes, whose rows must match Vanilla's one-token
    steps. Outside it (a prompt's prefill, always run alone at its own length; training; a drafter, whose
    drafts the target verifies) the fastest kernels run."""
    token = _ROWS_KEEP_BITS.set(on)
    try:
        yield
    finally:
        _ROWS_KEEP_BITS.reset(token)


# The most rows one CPU inference product takes at once, by dtype, so that every row keeps its bits
# whatever the rows beside it (lossless batching: a request's tokens must not depend on the batch). Measured,
# not taken from the kernels' documentation (tests/test_cpu_lossless.py checks it on the machine that runs
# the tests): MKL's float32 GEMM rounds a row of 4 or more rows otherwise than the same row with one other;
# bf16 by the CPU (`bf16_row_chunk`: 512 with AVX512-BF16, 32 with AMX or without a bf16 unit).
CPU_ROW_CHUNK = {torch.float32: 3, torch.bfloat16: bf16_row_chunk(cpu_flags()), torch.float16: 32}
SKINNY_ROWS = 16  # outside `rows_keep_bits`, products of up to this many rows take `_cpu_rows`' layout


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, except that CPU products under `rows_keep_bits` run in chunks that keep each row's bits.

    Rows go through `_cpu_rows` at most `CPU_ROW_CHUNK[dtype]` at a time, a lone row paired with a copy of
    itself (a one-row product takes a GEMV that rounds otherwise). So a row gets the same bits in a
    one-token decode step, in a verify pass of 9 positions and in a batch of 16 rows.
    """
    if invariant.mm_available(x, weight, bias):  # bf16/fp16 on a GPU: the same bits for any number of rows
        return invariant.mm(x, weight, bias)
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    chunk = CPU_ROW_CHUNK.get(x.dtype)
    if x.device.type != "cpu" or not rows or chunk is None or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    if not _ROWS_KEEP_BITS.get():  # a drafter, a prefill: few rows still take the fast layout
        chunk = SKINNY_ROWS
        if rows > chunk:
            return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    if rows <= chunk:
        out = _cpu_rows(flat, weight, bias)
    else:
        out = torch.cat([_cpu_rows(flat[i:i + chunk], weight, bias) for i in range(0, rows, chunk)])
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _cpu_rows(flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One CPU product of 1 to `CPU_ROW_CHUNK` rows, in the layout that streams the weights fastest.

    Decoding multiplies a few rows by each weight, and on a CPU the weights stream from memory. In
    float32, MKL reaches that bandwidth only as W @ xᵀ with x's rows dense, and only from 2 rows on; in
    bfloat16 the orientation turns: F.linear's oneDNN path on 2-D rows streams the weights, and the other
    way takes nearly twice as long.
    """
    rows = flat.shape[0]
    if rows == 1:  # a lone row goes to a GEMV: half the bandwidth in float32, other rounding in both
        flat = flat.expand(2, -1)
    if flat.dtype != torch.float32:  # 2-D: a 3-D x can take matmul's bmm path, which copies W every call
        return F.linear(flat, weight, bias)[:rows]
    out = (weight @ flat.contiguous().T)[:, :rows].T  # W @ xᵀ is fast only with xᵀ a transposed view
    return out + bias if bias is not None else out


class Linear(nn.Linear):
    """nn.Linear through `linear` (the skinny-CPU orientation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def fuse_linears(*layers: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One [sum of outputs, in] weight (and bias) whose row blocks the layers' parameters become.

    Frozen inference only: the layers keep their own parameters (so state_dicts, checkpoints and
    `load_state_dict` are unchanged), but as views of the fused tensor, so one GEMM serves them
    all and no memory is duplicated.
    """
    weight = torch.cat([layer.weight.detach() for layer in layers])
    with_bias = all(layer.bias is not None for layer in layers)
    bias = torch.cat([layer.bias.detach() for layer in layers]) if with_bias else None  # type: ignore[union-attr]
    start = 0
    for layer in layers:
        end = start + layer.out_features
        layer.weight = nn.Parameter(weight[start:end], requires_grad=False)
        if bias is not None:
            layer.bias = nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return weight, bias


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's own kernel (float32 inside): one kernel on a GPU where the written-out formula
        # took eight, a large share of a small model's decode step.
        if invariant.rms_norm_available(x, self.weight):  # bf16/fp16 on a GPU: a row's bits whatever the batch
            return invariant.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight.to(x.dtype), self.eps)


def _inv_freq(cfg: DecoderConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        inv = torch.where(is_mid, mid, scaled)
    elif kind not in (None, "default"):
        raise ValueError(f"rope scaling type {kind!r} is not supported (default, linear, llama3 are)")
    return inv.float()


class Rope:
    """One pass's cos and signed sin [b, q, d] (from `Rotary`), and their expansions over fused head
    layouts (`over`), built once a pass and shared by every layer."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.cos, self.sin = cos, sin
        self._over: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def over(self, roped: int, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for heads [b, q, total, d] whose first `roped` heads rotate and the rest (the
        values of a fused projection) pass through: cos 1, sin 0, so x·1 + roll(x)·0 is x.

        Why: rope then runs over the whole dense projection in same-shape elementwise kernels. Over the
        strided q/k slice with cos broadcast across heads, each multiply takes torch's slow indexed path.
        """
        key = (roped, total)
        if key not in self._over:
            b, q, d = self.cos.shape
            cos, sin = self.cos.unsqueeze(2).expand(b, q, roped, d), self.sin.unsqueeze(2).expand(b, q, roped, d)
            if total > roped:
                rest = (b, q, total - roped, d)
                cos = torch.cat([cos, self.cos.new_ones(1, 1, 1, 1).expand(rest)], dim=2)
                sin = torch.cat([sin, self.sin.new_zeros(1, 1, 1, 1).expand(rest)], dim=2)
            self._over[key] = (cos, sin)
        return self._over[key]


class Rotary(nn.Module):
    """cos/sin for arbitrary per-row positions, so every sequence of a batch has its own offset."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", _inv_freq(cfg), persistent=False)
        self.table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos and signed sin [positions, d]
        self._retired: list[tuple[torch.Tensor, torch.Tensor]] = []

    def fix_table(self, length: int, dtype: torch.dtype) -> None:
        """Keep cos/sin of positions [0, length) in `dtype`, so a forward whose positions lie below that
        looks them up: two kernels where computing them takes seven (a speculative decode step runs three:
        target, drafter, its extend). The values are the computed ones, bit for bit.

        A table is never freed: CUDA graphs captured against it keep its address (engines share a target).
        """
        table = self.table
        if table is not None and table[0].shape[0] >= length and table[0].dtype == dtype:
            return
        positions = torch.arange(length, device=self.inv_freq.device)
        fresh = self._compute(positions, dtype)
        if table is not None:
            self._retired.append(table)
        self.table = fresh

    def forward(self, positions: torch.Tensor, dtype: torch.dtype, bound: int | None = None) -> Rope:
        """cos and a *signed* sin, [-sin, sin] over the two halves, as `apply_rope` takes them.

        `bound`: a host-side bound every position lies below; the fixed table serves when it covers it.
        """
        table = self.table
        if bound is not None and table is not None and bound <= table[0].shape[0] and table[0].dtype == dtype \
                and table[0].device == positions.device:
            return Rope(table[0][positions], table[1][positions])  # dense [b, q, d], as computed ones are
        return Rope(*self._compute(positions, dtype))

    def _compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # [..., d/2]
        sin = freqs.sin()
        return torch.cat([freqs, freqs], dim=-1).cos().to(dtype), torch.cat([-sin, sin], dim=-1).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [b, q, heads, d]; cos/signed_sin broadcastable to it (`Rope.over`).

    The usual x·cos + [-x₂, x₁]·sin, with the sign moved into sin (once per pass, not per layer):
    [x₂, x₁] is one roll, so each call costs a kernel less; the result is bit for bit the same.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True = may attend) as the 0 / -inf bias attention adds. On a GPU its rows start at
    multiples of 16 elements, as the batch-invariant attention takes it (`invariant_attention.aligned_mask`)."""
    keys = mask.shape[-1]
    width = invariant_attention.aligned_width(keys) if mask.is_cuda else keys
    bias = torch.zeros(*mask.shape[:-1], width, dtype=dtype, device=mask.device)[..., :keys]
    return bias.masked_fill_(~mask, float("-inf"))


def grouped_queries(device: torch.device, batch: int, queries: int, groups: int) -> bool:
    """Whether a pass attends with its query heads folded into their kv groups (`fold_mask`).

    Measured with SmolLM2's 9 query heads over 3 kv heads: at 32 rows x 4 verified tokens cuDNN's GQA
    kernel slowed with the context where the folded layout, two copies included, did not; at a single
    token or 8 rows the folded one lost. So: verify blocks of at least 128 query rows, on a GPU, with
    GQA, where the batch-invariant kernel does not attend (float32, or ADAFLASH_TRITON=0).
    """
    return device.type == "cuda" and groups > 1 and 1 < queries <= 16 and batch * queries >= 128


def fold_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """[b, q, s] → [b, groups·q, s]: the mask of the folded layout, each query once per head of its group."""
    b, q, s = mask.shape
    return mask[:, None].expand(b, groups, q, s).reshape(b, groups * q, s)


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig, in_features: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        d_in = in_features or cfg.hidden_size
        bias = cfg.attention_bias
        self.num_heads, self.num_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = Linear(d_in, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(d_in, self.num_kv * self.head_dim, bias=bias)
        self.v_proj = Linear(d_in, self.num_kv * self.head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by `fuse`

    def fuse(self) -> None:
        """One GEMM for q, k and v, and one rope for q and k together (frozen inference only)."""
        if self.qkv is None:
            self.qkv = fuse_linears(self.q_proj, self.k_proj, self.v_proj)

    def project_qkv(self, x: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [b, n, heads, d], k and v [b, n, kv, d], roped; one GEMM and one rope over all heads when
        `fuse` was called."""
        if self.qkv is None:
            return (self.project_q(x, rope), *self.project_kv(x, rope))
        q, k, v = self._split_roped(self._fused_heads(x, self.qkv, self.num_heads), self.num_heads, rope)
        assert q is not None and k is not None and v is not None
        return q, k, v

    def project_q_caching_kv(self, x: torch.Tensor, rope: Rope, cache: KVCache, layer: int,
                             where: torch.Tensor) -> torch.Tensor:
        """Roped q [b, n, heads, d]; the roped keys and values go into `cache` (layer `layer`, flat
        indices `where`). On a GPU the rope kernel stores them itself, two copy kernels a layer fewer."""
        if self.qkv is None:
            q, k, v = self.project_qkv(x, rope)
            cache.write(layer, where, k, v)
            return q
        heads = self._fused_heads(x, self.qkv, self.num_heads)
        q, _, _ = self._split_roped(heads, self.num_heads, rope, store=(cache, layer, where))
        assert q is not None
        return q

    def caching_kv(self, x: torch.Tensor, rope: Rope, cache: KVCache, layer: int, where: torch.Tensor) -> None:
        """The roped keys and values of `x` into `cache` (layer `layer`, flat indices `where`): no query.
        Fused, the rope kernel stores them itself, as `project_q_caching_kv` does (the DFlash drafter's
        context gains each step's accepted positions this way, two copy kernels a layer fewer)."""
        if self.qkv is None:
            cache.write(layer, where, *self.project_kv(x, rope))
            return
        self._split_roped(self._fused_kv_heads(x), 0, rope, store=(cache, layer, where))

    def _fused_kv_heads(self, x: torch.Tensor) -> torch.Tensor:
        """Keys and values only: the last rows of the fused weight, a single GEMM."""
        assert self.qkv is not None
        start = self.num_heads * self.head_dim
        weight, bias = self.qkv
        return self._fused_heads(x, (weight[start:], bias[start:] if bias is not None else None), 0)

    def _fused_heads(self, x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor | None],
                     queries: int) -> torch.Tensor:
        b, n, _ = x.shape
        return linear(x, *weights).reshape(b, n, queries + 2 * self.num_kv, self.head_dim)

    def _split_roped(self, heads: torch.Tensor, queries: int, rope: Rope,
                     store: tuple[KVCache, int, torch.Tensor] | None = None
                     ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Dense fused heads [b, n, queries + 2·kv, d] (query heads first, if any) → roped q (None
        without query heads), roped k, and v; per-head norms first where the model has them. With
        `store` (cache, layer, flat indices), k and v go into the cache and come back as None.

        Rope runs over every head, values included (`Rope.over` passes them through), so its kernels
        read one dense tensor; with norms the normed heads are gathered back into one first.
        """
        roped = queries + self.num_kv
        into = None  # where the rope kernel stores k and v itself
        if fused_rope_available(heads):  # one kernel on a GPU, norms included
            norms = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.cfg.qk_norm else None
            if store is not None and store[0].k.dtype == heads.dtype:
                into = (*store[0].flat_layer(store[1]), store[2])
            out = rope_heads(heads, rope.cos, rope.sin, queries, roped, norms, into)
        else:
            if self.cfg.qk_norm:
                parts = [self.q_norm(heads[:, :, :queries])] if queries else []
                heads = torch.cat([*parts, self.k_norm(heads[:, :, queries:roped]), heads[:, :, roped:]], dim=2)
            out = apply_rope(heads, *rope.over(roped, heads.shape[2]))
        q = out[:, :, :queries] if queries else None
        if store is None:
            return q, out[:, :, queries:roped], out[:, :, roped:]
        if into is None:  # eager rope, or a cache of another dtype: copy k and v in
            cache, layer, where = store
            cache.write(layer, where, out[:, :, queries:roped], out[:, :, roped:])
        return q, None, None

    def project_q(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        b, q, _ = x.shape
        out = self.q_proj(x).view(b, q, self.num_heads, self.head_dim)
        if self.cfg.qk_norm:
            out = self.q_norm(out)
        return apply_rope(out, *rope.over(self.num_heads, self.num_heads))

    def project_kv(self, x: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        b, q, _ = x.shape
        if self.qkv is not None:
            _, k, v = self._split_roped(self._fused_kv_heads(x), 0, rope)
            assert k is not None and v is not None
            return k, v
        k = self.k_proj(x).view(b, q, self.num_kv, self.head_dim)
        v = self.v_proj(x).view(b, q, self.num_kv, self.head_dim)
        if self.cfg.qk_norm:
            k = self.k_norm(k)
        return apply_rope(k, *rope.over(self.num_kv, self.num_kv)), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
               limit: torch.Tensor | None = None) -> torch.Tensor:
        """q: [b, q, h, d]; k, v: [b, s, kv, d]; mask [b, q, s]: bool (True = may attend) or additive
        (`additive_mask`, made once per forward rather than converted by every layer). `limit` [b]:
        where each row's visible keys end, if known (the GPU kernel then reads no key past it)."""
        b, nq = q.shape[:2]
        if invariant_attention.attention_available(self.head_dim, q, k, v):  # bf16/fp16 on a GPU: a query's bits whatever the batch
            out = invariant_attention.attention(q, k, v, mask, limit)
            return self.o_proj(out.reshape(b, nq, self.num_heads * self.head_dim))
        if mask.shape[1] != nq:
            return self._attend_grouped(q, k, v, mask)
        if q.device.type == "cpu" and _ROWS_KEEP_BITS.get():
            return self.o_proj(cpu_row_invariant_attention(q, k, v, mask).reshape(b, nq, self.num_heads * self.head_dim))
        gqa = self.num_heads != self.num_kv
        if gqa and q.is_cuda and q.requires_grad:
            # training on a GPU: the memory-efficient kernel takes a mask but not grouped heads, and SDPA
            # with both fell back to its unfused math (a large share of a memoized DFlash step)
            (k, v), gqa = self._ungrouped(k, v), False
        q = q.transpose(1, 2)
        if q.stride(-1) != 1:
            # rope's broadcast can hand back q with a strided last dimension; the fused kernels need it
            # dense, else SDPA falls back to its unfused math (about three times slower on a CPU)
            q = q.contiguous()
        out = F.scaled_dot_product_attention(
            q, k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask.unsqueeze(1), enable_gqa=gqa,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, nq, self.num_heads * self.head_dim))

    def attend_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over whole sequences from position 0, with no cache and no mask.

        Why: a [b, q, s] mask with grouped heads sends SDPA to its unfused math (scores, mask and
        softmax materialized): that was most of a training step whose target features were not memoized.
        Without a mask the fused kernels run (flash on a GPU).
        Right padding is harmless: a real position sees only the positions before it.
        """
        b, n = q.shape[:2]
        k, v = self._ungrouped(k, v)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if q.is_cuda and torch.is_autocast_enabled("cuda"):
            dtype = torch.get_autocast_dtype("cuda")
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))

    def _ungrouped(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [b, s, kv, d] repeated to one head per query head: for kernels without GQA."""
        groups = self.num_heads // self.num_kv
        if groups == 1:
            return k, v
        return k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)

    def _attend_grouped(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """GQA as one kv head per group with the group's query heads stacked along the query length
        (mask from `fold_mask`): plain attention instead of a grouped kernel (see `grouped_queries`)."""
        b, nq, groups = q.shape[0], q.shape[1], self.num_heads // self.num_kv
        folded = q.reshape(b, nq, self.num_kv, groups, self.head_dim).permute(0, 2, 3, 1, 4)
        out = F.scaled_dot_product_attention(
            folded.reshape(b, self.num_kv, groups * nq, self.head_dim), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask.unsqueeze(1),
        )
        out = out.view(b, self.num_kv, groups, nq, self.head_dim).permute(0, 3, 1, 2, 4)
        return self.o_proj(out.reshape(b, nq, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: torch.Tensor | None = None  # set by `fuse`

    def fuse(self) -> None:
        """One GEMM for gate and up (frozen inference only)."""
        if self.gate_up is None:
            self.gate_up = fuse_linears(self.gate_proj, self.up_proj)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(silu_mul(linear(x, self.gate_up)))


class DecoderLayer(nn.Module):
    """A pre-norm decoder layer; how keys/values are gathered is the caller's business."""

    def __init__(self, cfg: DecoderConfig, attn_in_features: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(attn_in_features or cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, attn_in_features)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def mlp_block(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.post_attention_layernorm(h))

    def causal(self, h: torch.Tensor, rope: Rope) -> torch.Tensor:
        """The layer over whole sequences from position 0, without a cache (training's target features)."""
        attn = self.self_attn
        q, k, v = attn.project_qkv(self.input_layernorm(h), rope)
        return self.mlp_block(h + attn.attend_causal(q, k, v))

    def cached(self, h: torch.Tensor, rope: Rope, mask: torch.Tensor, cache: KVCache, index: int,
               where: torch.Tensor, rows: torch.Tensor, kv_len: int, limit: torch.Tensor | None = None) -> torch.Tensor:
        """The layer over positions whose keys and values join `cache` (layer `index`, at the flat
        indices `where`), attending to the first `kv_len` cached positions of `rows` under `mask`
        (none past `limit`, `Attention.attend`): the target's forward and the DFlash drafter's block share it."""
        attn = self.self_attn
        q = attn.project_q_caching_kv(self.input_layernorm(h), rope, cache, index, where)
        keys, values = cache.read(index, rows, kv_len)
        return self.mlp_block(h + attn.attend(q, keys, values, mask, limit))
