"""A slot-based KV cache: each batch row (slot) has its own length, so rollback is a length change."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values laid out [layer, slot, position, kv_head, head_dim].

    Writes go to explicit per-row positions; nothing past `lens[slot]` is ever read as context,
    so rejecting drafted tokens only means setting the length back. Callers `reserve` the
    positions they will touch with a host-side int, so a step never waits on the device.
    """

    def __init__(
        self,
        num_layers: int,
        slots: int,
        max_len: int,
        kv_heads: int,
        head_dim: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        static: bool = False,
    ) -> None:
        # A growable cache doubles on demand, so a large max_len costs nothing until sequences
        # get long. A static one is allocated whole: CUDA graphs keep pointers to its storage.
        capacity = max_len if static else min(max_len, 256)
        shape = (num_layers, slots, capacity, kv_heads, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lens = torch.zeros(slots, dtype=torch.long, device=device)
        self.max_len = max_len
        # Set while a pass runs over rows 0..b-1 in order (`DevicePasses.rows_for`): reads are then
        # views. Otherwise each layer's read gathers its rows' keys and values, two kernels a layer
        # (for a small target at batch 1, a sizeable share of a decode step).
        self.in_order = False

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    def reserve(self, length: int) -> None:
        """Make positions [0, length) writable."""
        if length > self.max_len:
            raise ValueError(f"sequence exceeds the KV cache ({self.max_len} positions)")
        if length > self.capacity:
            capacity = min(self.max_len, max(length, 2 * self.capacity))
            pad = (*self.k.shape[:2], capacity - self.capacity, *self.k.shape[3:])
            self.k = torch.cat([self.k, self.k.new_zeros(pad)], dim=2)
            self.v = torch.cat([self.v, self.v.new_zeros(pad)], dim=2)

    def where(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Flat cache indices [b·q] of positions [b, q] in slots `rows` [b], for `write`. Computed once
        per forward (after `reserve`, whose growth changes the layout) and shared by every layer: a
        (slot, position) pair index would be broadcast and copied again by each layer's write."""
        return (rows[:, None] * self.capacity + positions).reshape(-1)

    def write(self, layer: int, where: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [b, q, kv, d] written at the flat indices `where` (from `where`, already reserved)."""
        keys, values = self.flat_layer(layer)
        keys.index_copy_(0, where, k.reshape(-1, *keys.shape[1:]).to(keys.dtype))
        values.index_copy_(0, where, v.reshape(-1, *values.shape[1:]).to(values.dtype))

    def flat_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s keys and values as [slots·capacity, kv, d] views, the rows `where` indexes:
        what a kernel that stores keys and values itself writes into."""
        shape = (-1, *self.k.shape[3:])
        return self.k[layer].view(shape), self.v[layer].view(shape)

    def read(self, layer: int, rows: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.in_order:
            if rows.device.type == "cpu" and _consecutive(rows) != 0:  # checked where it costs no sync
                raise RuntimeError(f"KVCache.in_order is set but the rows are {rows.tolist()}, not 0..b-1")
            first = 0
        else:
            first = _consecutive(rows)
        if first is not None:  # a view: no copy of every row's keys and values per layer
            span = slice(first, first + rows.shape[0])
            return self.k[layer, span, :length], self.v[layer, span, :length]
        return self.k[layer, rows, :length], self.v[layer, rows, :length]

    def reset(self, rows: torch.Tensor) -> None:
        self.lens[rows] = 0


def _consecutive(rows: torch.Tensor) -> int | None:
    """The first slot when `rows` are consecutive slots, on CPU only (a GPU check would sync,
    and CUDA graphs replay whatever rows they are given)."""
    if rows.device.type != "cpu" or rows.dim() != 1 or rows.numel() == 0:
        return None
    first = int(rows[0])
    if rows.numel() > 1 and not torch.equal(rows, torch.arange(first, first + rows.numel(), dtype=rows.dtype)):
        return None
    return first
