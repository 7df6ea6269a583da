"""Fused GPU kernels (Triton) for steps that eager torch splits into several small, strided kernels.

Each has an eager twin that gives the same bits; `silu_mul` picks the kernel only on a CUDA tensor
outside autograd, with Triton importable, and falls back to the twin everywhere else (CPU, training).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # Triton ships with CUDA builds of torch on Linux; CPU-only installs do without it
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def silu_mul_eager(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up of a fused [..., 2I] gate/up projection: the textbook two kernels."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def fused_silu_mul_available(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda and not (torch.is_grad_enabled() and x.requires_grad)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu_mul_eager`, as one kernel on a GPU.

    Why: at 4 tokens (a verify) the gate and up halves are strided slices, and silu then mul each take
    torch's slow indexed path: measured on an H200 (bf16, SmolLM2's 1536-wide MLP, 30 calls in a
    graph), 4.2 us a layer against 2.8 us for the same two kernels on dense halves, and 3.0 us at one
    token. One kernel reads both halves and writes the product once.
    """
    if not fused_silu_mul_available(gate_up):
        return silu_mul_eager(gate_up)
    width = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], width, device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, block))](
        rows, out, width, rows.stride(0), BLOCK=block, num_warps=4)
    return out.view(*gate_up.shape[:-1], width)


if triton is not None:

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, width, row_stride, BLOCK: tl.constexpr):
        """One row's block of columns: silu in float32 as torch computes it, x / (1 + exp(-x)) with
        an IEEE division and libdevice's exp, rounded to the input dtype; then the product with up in
        float32, rounded once more (torch's two kernels round at the same two places)."""
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = cols < width
        base = x_ptr + row * row_stride
        gate = tl.load(base + cols, mask=keep, other=0.0)
        up = tl.load(base + width + cols, mask=keep, other=0.0)
        g = gate.to(tl.float32)
        silu = tl.math.div_rn(g, 1.0 + libdevice.exp(-g)).to(gate.dtype)
        product = (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
        tl.store(out_ptr + row * width + cols, product, mask=keep)
