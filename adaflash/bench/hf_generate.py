"""transformers' own `generate()` on the engine bench's token ids: the reference the embedded engine is
measured against (`bench engine --compare-hf`), plain greedy or prompt-lookup assisted."""

from __future__ import annotations

from typing import Any


def hf_generate(model: Any, target: Any, chunk: list[list[int]], max_new_tokens: int, lookup: int | None,
                calls: list[int]) -> list[list[int]]:
    """Greedy `generate()` on a static batch (left padding); each row cut after its first eos.

    `calls[0]` counts the model's forward passes (τ of prompt lookup = tokens per forward).
    """
    import torch
    from transformers import GenerationConfig

    eos = list(target.eos_ids)
    pad = target.tokenizer.pad_token_id
    pad = eos[0] if pad is None and eos else (pad or 0)
    width = max(len(ids) for ids in chunk)
    input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
    mask = torch.zeros((len(chunk), width), dtype=torch.long)
    for row, ids in enumerate(chunk):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        mask[row, width - len(ids):] = 1
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                              eos_token_id=eos or None, pad_token_id=pad)
    if lookup:
        config.prompt_lookup_num_tokens = lookup
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids.to(model.device), attention_mask=mask.to(model.device),
                                 generation_config=config)
    finally:
        hook.remove()
    rows = []
    for seq in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(seq) if t in eos), len(seq))
        rows.append(seq[:cut])
    return rows
