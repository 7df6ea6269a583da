"""Tiny random targets: real HF model folders that build in a second, for tests and smoke runs."""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def make_tiny_target(
    out: str | Path,
    tokenizer_from: str | Path,
    *,
    model_type: str = "llama",
    layers: int = 4,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    init_std: float = 0.5,
) -> Path:
    """Save a random `model_type` decoder with the tokenizer of `tokenizer_from` (its vocab size).

    The default large `init_std` gives peaked, varied logits (few greedy near-ties); a small one
    gives a model dominated by its tied embedding that keeps repeating itself, which a drafter
    can learn in a few steps.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_from))
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0, init_std)
    model.save_pretrained(str(out))
    for name in TOKENIZER_FILES:
        source = Path(tokenizer_from) / name
        if source.is_file():
            shutil.copy(source, out / name)
    return out
