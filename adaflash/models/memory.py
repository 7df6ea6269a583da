"""Peak GPU memory, as benchmarks and the pipeline report it: what a batch size or a shared GPU costs."""

from __future__ import annotations

import torch


def peak_memory_gib(device: torch.device | str) -> float | None:
    """The most memory torch's allocator has held on `device` since the process began (or the last
    reset), in GiB; None off CUDA, where no allocator keeps the figure."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30
