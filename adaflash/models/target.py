"""The target runner: our own Llama/Qwen2/Qwen3 decoder over a slot KV cache.

Why our own: batched speculative decoding needs per-row positions, per-row rollback and the
hidden states of chosen layers in the same pass; transformers' generate offers none of these
together. Logits are checked against transformers in the tests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from adaflash.models import invariant_attention
from adaflash.models.cache import KVCache
from adaflash.models.cpu_attention import DECODE_QUERIES
from adaflash.models.layers import (
    DecoderConfig,
    DecoderLayer,
    Linear,
    RMSNorm,
    Rotary,
    additive_mask,
    fold_mask,
    grouped_queries,
    rows_keep_bits,
)

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "mistral")


class _Backbone(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def causal_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[b, q, kv_len]: a query at position p sees keys 0..p of its own row."""
    keys = torch.arange(kv_len, device=positions.device)
    return keys[None, None, :] <= positions[:, :, None]


class TargetModel(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = _Backbone(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(cfg)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def new_cache(self, slots: int, max_len: int, *, static: bool = False) -> KVCache:
        c = self.cfg
        return KVCache(c.num_hidden_layers, slots, max_len, c.num_key_value_heads, c.head_dim,
                       device=self.device, dtype=self.dtype, static=static)

    def fuse_projections(self) -> None:
        """q/k/v and gate/up each become one GEMM (views of one weight; state_dict unchanged).

        Frozen inference only: a decode step of a small model is launch-bound, and this removes
        three of every layer's seven GEMMs. Call it after the last dtype/device change.
        """
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + lm_head: the drafters reuse these frozen weights."""
        return self.lm_head(self.model.norm(hidden))

    @torch.no_grad()
    def hidden_states(self, input_ids: torch.Tensor, capture: Sequence[int]) -> list[torch.Tensor]:
        """The outputs of the `capture` layers [b, S, H] over whole sequences from position 0.

        What training reads: no cache to fill, no mask (`DecoderLayer.causal`), and no layer past the
        last one captured.
        """
        b, width = input_ids.shape
        h = self.model.embed_tokens(input_ids)
        positions = torch.arange(width, device=input_ids.device).expand(b, width)
        rope = self.rotary(positions, h.dtype, bound=width)
        wanted = set(capture)
        out: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(self.model.layers[: max(capture) + 1]):
            h = layer.causal(h, rope)
            if index in wanted:
                out[index] = h
        return [out[i] for i in capture]

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        rows: torch.Tensor,
        *,
        capture: Sequence[int] = (),
        logits_index: torch.Tensor | None = None,
        kv_len: int | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run `input_ids` [b, q] at `positions` [b, q] for cache slots `rows` [b].

        Writes their keys/values into the cache (the caller then sets `cache.lens`); returns
        logits ([b, q, V], or [b, V] at `logits_index`) and the outputs of the `capture` layers
        (feature of layer i = hidden_states[i + 1] in HF terms), each [b, q, H].
        """
        h = self.model.embed_tokens(input_ids)
        kv_len = int(positions.max()) + 1 if kv_len is None else kv_len
        rope = self.rotary(positions, h.dtype, bound=kv_len)
        cache.reserve(kv_len)
        mask = additive_mask(causal_mask(positions, kv_len), h.dtype)
        groups = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        limit = None
        if invariant_attention.attention_available(self.cfg.head_dim, h):  # causal: a row sees no key past its last position
            limit = positions.amax(1).add(1).to(torch.int32)
        elif grouped_queries(h.device, *input_ids.shape, groups):
            mask = fold_mask(mask, groups)
        where = cache.where(rows, positions)
        wanted = {layer: i for i, layer in enumerate(capture)}
        captured: list[torch.Tensor | None] = [None] * len(capture)
        # decode and verify passes: each row's bits whatever the batch (a prompt's prefill runs alone)
        with rows_keep_bits(input_ids.shape[1] <= DECODE_QUERIES):
            for index, layer in enumerate(self.model.layers):
                h = layer.cached(h, rope, mask, cache, index, where, rows, kv_len, limit)
                if index in wanted:
                    captured[wanted[index]] = h
            if logits_index is not None:
                h = h[torch.arange(h.shape[0], device=h.device), logits_index]
            return self.logits(h), captured  # type: ignore[return-value]


def read_hf_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a model folder")
    return json.loads(path.read_text())


def load_target_model(folder: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32) -> TargetModel:
    """Load a HF safetensors folder into our decoder, refusing families we do not implement."""
    folder = Path(folder)
    raw = read_hf_config(folder)
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise ValueError(
            f"{folder}: model_type {model_type!r} is not supported by the embedded engine "
            f"(supported: {', '.join(SUPPORTED_TYPES)}); serve it with --engine sglang"
        )
    cfg = DecoderConfig.from_hf(raw)
    with torch.device("meta"):
        model = TargetModel(cfg)
    state: dict[str, torch.Tensor] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors weights")
    for file in files:
        state.update(load_file(str(file)))
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model = model.to_empty(device=device)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "lm_head.weight" and not m.startswith("rotary")]
    if missing or unexpected:
        raise ValueError(f"{folder}: weights do not match the config (missing {missing[:5]}, unexpected {unexpected[:5]})")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.rotary = Rotary(cfg).to(device)
    model = model.to(dtype).eval()
    model.fuse_projections()  # the target is frozen everywhere: engine, regeneration, training features
    return model
