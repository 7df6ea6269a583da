"""The AdaFlash adaptive length head: how much of a drafted block is worth verifying."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LengthHead(nn.Module):
    """cat[mean(h), h_last] → Linear(2H→W) → SiLU → residual MLP → Linear(W→1) → sigmoid.

    Predicts candidate_len / B from the drafter's hidden states, which it sees detached: the
    head has its own optimizer and never pushes gradients into the drafter.
    """

    def __init__(self, hidden_size: int, width: int = 256) -> None:
        super().__init__()
        self.proj_in = nn.Linear(2 * hidden_size, width)
        self.res_fc1 = nn.Linear(width, width)
        self.res_fc2 = nn.Linear(width, width)
        self.proj_out = nn.Linear(width, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [b, B, H] → predicted fraction in (0, 1), shape [b]."""
        hidden = hidden.detach()
        x = torch.cat([hidden.mean(dim=1), hidden[:, -1]], dim=-1)
        z = F.silu(self.proj_in(x))
        z = z + self.res_fc2(F.silu(self.res_fc1(z)))
        return torch.sigmoid(self.proj_out(z)).squeeze(-1)
