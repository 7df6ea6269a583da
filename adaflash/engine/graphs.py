"""CUDA-graph capture and replay of the engine's fixed-shape passes.

A decode step of a 135M model launches ~600 small kernels; on a GPU the launches, not the math,
set the speed. Each pass (target verify, drafter draft, drafter extend) is captured once per
shape key and replayed with its inputs copied into static buffers. Shapes are padded to a few
buckets (`bucket`), so a handful of graphs serve every batch. On CPU the runner just calls the
function: nothing is padded or captured.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


def bucket(n: int, cap: int, floor: int = 1) -> int:
    """The smallest power of two >= n (at least `floor`), never above `cap`."""
    size = max(floor, 1)
    while size < n:
        size *= 2
    return min(size, cap)


@dataclass
class _Graph:
    graph: Any
    inputs: list[torch.Tensor]
    outputs: Any


def _clone(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (list, tuple)):
        return type(out)(_clone(o) for o in out)
    return out


class GraphRunner:
    """Replays `fn(*inputs)` from a graph captured for `key`; plain calls when disabled.

    Graphs of one lane share a memory pool, so two of them must never run at once. Admissions have a
    lane of their own ("admit"): their prefills may run on a side stream beside decoding
    (`engine.admission`), where a shared pool would let the two graphs' intermediates overlap.
    """

    LANES = ("decode", "admit")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.graphs: dict[Hashable, _Graph] = {}
        self.pools = self._fresh_pools() if enabled else {}

    def run(self, key: Hashable, fn: Callable[..., Any], inputs: Sequence[torch.Tensor], lane: str = "decode") -> Any:
        if not self.enabled:
            return fn(*inputs)
        entry = self.graphs.get((lane, key))
        if entry is None:
            entry = self.graphs[(lane, key)] = self._capture(fn, inputs, self.pools[lane])
        for static, value in zip(entry.inputs, inputs):
            static.copy_(value)
        entry.graph.replay()
        # Graphs of a lane share a memory pool, so an output lives only until the lane's next replay: copy it.
        return _clone(entry.outputs)

    def _capture(self, fn: Callable[..., Any], inputs: Sequence[torch.Tensor], pool: Any) -> _Graph:
        static = [x.clone() for x in inputs]
        # Warm up on a side stream (allocator and kernel selection), as torch.cuda.graphs requires.
        # The passes only write cache positions the real call writes too, so warm-ups are harmless.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn(*static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outputs = fn(*static)
        return _Graph(graph, static, outputs)

    def clear(self) -> None:
        """Forget every graph (a drafter of another shape was installed).

        The pool dies with its last graph, so later captures need a fresh pool handle.
        """
        self.graphs.clear()
        if self.enabled:
            self.pools = self._fresh_pools()

    def _fresh_pools(self) -> dict[str, Any]:
        return {lane: torch.cuda.graph_pool_handle() for lane in self.LANES}

    def __len__(self) -> int:
        return len(self.graphs)
