"""`adaflash bench cost`: the verify-cost curve, what one target pass of k tokens costs at batch b.

Why: speculative decoding pays τ / (cost of a step in Vanilla steps), and an adaptive length head can
only win where verifying fewer tokens is cheaper (docs/benchmarks.md). This measures that cost
directly, through the engine's own verify pass (`DevicePasses.verify`, greedy: the argmax is taken in
the pass), with every row holding `context` tokens of cache: on a GPU padded to the engine's buckets
and replayed from its CUDA graphs, on a CPU eager at the exact shapes. The drafter, the acceptance and
the host's work around a step are not in it.

Each cell is timed pass by pass: the device is synchronized before and after each pass, so a pass's
time runs from its launch to its last kernel; the median of `repeats` passes after `warmup` unmeasured
ones (on a GPU the first of these captures the cell's graph).

The roofline: a Vanilla decode step must read every weight once (less the embedding table, of which
it reads a row per token, unless the lm_head shares it) and each row's cache of `context` tokens.
Those bytes over the memory bandwidth are the floor of a k=1 pass; `share` is floor / measured.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Memory bandwidth (GB/s) by device name, most specific first: the roofline's default.
BANDWIDTH_GBS = (("H200", 4800.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0), ("H100", 3350.0))
PREFILL_TOKENS = 4096  # context positions filled per prefill call


class CostBenchError(ValueError):
    """A bad setting, said in the words of the option it came from."""


@dataclass
class CostSpec:
    target: str
    batch_sizes: list[int]
    widths: list[int]
    context: int = 512
    device: str | None = "auto"
    dtype: str | None = "bf16-if-native"
    repeats: int = 20
    warmup: int = 3
    bandwidth_gbs: float | None = None  # None: by the device's name (BANDWIDTH_GBS), else no roofline
    seed: int = 0
    label: str | None = None

    def config(self) -> dict[str, Any]:
        return {"bench": "cost", **{k: getattr(self, k) for k in self.__dataclass_fields__}}


def parse_sizes(text: str, option: str, example: str) -> list[int]:
    """'1,8,32' → [1, 8, 32], ascending, duplicates dropped; errors name the option."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise CostBenchError(f"{option} is empty; give e.g. {example}")
    try:
        values = sorted({int(part) for part in items})
    except ValueError:
        raise CostBenchError(f"{option} must be comma-separated integers (e.g. {example}), "
                             f"got {text!r}") from None
    if values[0] < 1:
        raise CostBenchError(f"{option} values must be ≥ 1, got {text!r}")
    return values


def bandwidth_of(device_name: str) -> float | None:
    """The memory bandwidth (GB/s) of a known GPU by its name, or None."""
    for key, gbs in BANDWIDTH_GBS:
        if key.lower() in device_name.lower():
            return gbs
    return None


@dataclass
class CostResult:
    spec: CostSpec
    hardware: str
    dtype: str
    cuda_graphs: bool
    kernels: str
    max_len: int
    weight_bytes: int
    kv_bytes_per_token: int
    bandwidth_gbs: float | None
    cells: list[dict[str, Any]] = field(default_factory=list)  # {batch, width, ms, ms_min, ms_max, ratio}
    peak_memory_gib: float | None = None

    def cell(self, batch: int, width: int) -> dict[str, Any]:
        return next(c for c in self.cells if c["batch"] == batch and c["width"] == width)

    def roofline(self) -> list[dict[str, Any]]:
        """Per batch: the bytes a Vanilla decode step must read, their floor in ms at the bandwidth, and the
        share of it the narrowest measured pass reaches (when k=1 is measured, that is Vanilla's pass)."""
        rows = []
        narrowest = min(self.spec.widths)
        for batch in self.spec.batch_sizes:
            read = self.weight_bytes + self.kv_bytes_per_token * self.spec.context * batch
            floor = read / (self.bandwidth_gbs * 1e9) * 1e3 if self.bandwidth_gbs else None
            measured = self.cell(batch, narrowest)["ms"]
            rows.append({"batch": batch, "width": narrowest, "bytes_read": read, "floor_ms": floor,
                         "ms": measured, "share": floor / measured if floor else None})
        return rows

    def as_json(self) -> dict[str, Any]:
        return {"target": self.spec.target, "hardware": self.hardware, "dtype": self.dtype,
                "cuda_graphs": self.cuda_graphs, "kernels": self.kernels, "context": self.spec.context,
                "max_len": self.max_len, "repeats": self.spec.repeats, "warmup": self.spec.warmup,
                "weight_bytes": self.weight_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
                "bandwidth_gbs": self.bandwidth_gbs, "peak_memory_gib": self.peak_memory_gib,
                "cells": self.cells, "roofline": self.roofline()}


def weight_bytes(model: Any) -> int:
    """Bytes of weights one decode step reads: every parameter once, the embedding table not (a step
    reads a row of it per token) unless the lm_head is that same table."""
    embed = model.model.embed_tokens.weight
    tied = model.lm_head.weight is embed
    return sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not embed)


def kv_bytes_per_token(model: Any) -> int:
    cfg = model.cfg
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * model.dtype.itemsize


def _graphs_setting() -> bool | None:
    """ADAFLASH_CUDA_GRAPHS=0 runs the passes eagerly on a GPU too, as every engine command does."""
    value = os.environ.get("ADAFLASH_CUDA_GRAPHS", "").strip().lower()
    if not value:
        return None
    if value not in ("0", "1", "false", "true", "off", "on"):
        raise CostBenchError(f"ADAFLASH_CUDA_GRAPHS={value!r}: expected 0 or 1")
    return value in ("1", "true", "on")


class CostBench:
    """Load the target once, fill every slot's cache with `context` tokens, then time every (b, k) cell."""

    def __init__(self, spec: CostSpec, say: Callable[[str], None] | None = None, *,
                 pad_shapes: bool | None = None) -> None:
        if spec.context < 1:
            raise CostBenchError(f"--context must be at least 1, got {spec.context}")
        if spec.repeats < 1:
            raise CostBenchError(f"--repeats must be at least 1, got {spec.repeats}")
        self.spec = spec
        self.say = say or (lambda _message: None)
        self.pad_shapes = pad_shapes  # the tests pad on a CPU too, as a GPU does
        self.result: CostResult | None = None  # set by `load`

    def load(self) -> None:
        import torch

        from adaflash.bench.engine_bench import hardware_of
        from adaflash.engine.graphs import bucket
        from adaflash.engine.passes import DevicePasses
        from adaflash.models.kernels import kernels_on
        from adaflash.models.loading import load_target

        spec = self.spec
        try:
            self.target = load_target(spec.target, device=spec.device, dtype=spec.dtype, with_tokenizer=False)
        except (OSError, ValueError, RuntimeError, AssertionError) as err:  # no CUDA build → AssertionError
            raise CostBenchError(f"--target {spec.target} on --device {spec.device or 'auto'}: "
                                 f"cannot load it ({err})") from None
        model = self.target.model
        self.on_cuda = model.device.type == "cuda"
        widest = max(spec.widths)
        # As long as the engine's own cache would be rounded to: a pass attends over the same padded keys.
        max_len = bucket(spec.context + widest + 1, 1 << 30)
        if max_len > self.target.max_context:
            raise CostBenchError(f"--context {spec.context} with --widths up to {widest}: more than the "
                                 f"target's {self.target.max_context} positions")
        graphs = _graphs_setting()
        self.passes = DevicePasses(model, max_batch=max(spec.batch_sizes), max_len=max_len,
                                   cuda_graphs=None if graphs is None else graphs and self.on_cuda,
                                   pad_shapes=self.pad_shapes)
        bandwidth = spec.bandwidth_gbs
        hardware = hardware_of(model.device)
        if bandwidth is None and self.on_cuda:
            bandwidth = bandwidth_of(torch.cuda.get_device_name(model.device))
        self.result = CostResult(spec=spec, hardware=hardware, dtype=str(model.dtype).removeprefix("torch."),
                                 cuda_graphs=self.passes.graphs.enabled, kernels=kernels_on(model.device),
                                 max_len=max_len, weight_bytes=weight_bytes(model),
                                 kv_bytes_per_token=kv_bytes_per_token(model), bandwidth_gbs=bandwidth)
        self.generator = torch.Generator().manual_seed(spec.seed)

    def fill(self) -> None:
        """Every slot (padding slots included) holds `context` tokens of random ids in the cache."""
        import torch

        model, passes, context = self.target.model, self.passes, self.spec.context
        slots = passes.max_batch
        per_call = max(1, PREFILL_TOKENS // context)
        with torch.no_grad():
            for first in range(0, slots, per_call):
                rows = torch.arange(first, min(slots, first + per_call), device=model.device)
                ids = self._ids(rows.shape[0], context)
                positions = torch.arange(context, device=model.device).expand(rows.shape[0], context)
                last = torch.full_like(rows, context - 1)
                model(ids, positions, passes.cache, rows, logits_index=last, kv_len=context)
                passes.cache.lens[rows] = context
        self._sync()

    def _ids(self, rows: int, width: int) -> Any:
        import torch

        vocab = self.target.model.cfg.vocab_size
        return torch.randint(0, vocab, (rows, width), generator=self.generator).to(self.target.model.device)

    def _sync(self) -> None:
        if self.on_cuda:
            import torch

            torch.cuda.synchronize()

    def pass_timer(self, batch: int, width: int) -> Callable[[], float]:
        """A function that runs the (batch, width) verify pass once over rows holding `context` tokens and
        returns its milliseconds."""
        import torch

        passes, context = self.passes, self.spec.context
        slots, in_order = passes.rows_for(list(range(batch)), fill=True)
        rows = torch.tensor(slots, device=self.target.model.device)
        block = self._ids(len(slots), width)
        lens = torch.full((len(slots),), context, dtype=torch.long, device=rows.device)

        def one() -> float:
            self._sync()
            started = time.perf_counter()
            with torch.no_grad():
                passes.verify(rows, block, lens, context, greedy=True, in_order=in_order)
            self._sync()
            return (time.perf_counter() - started) * 1e3

        return one

    def time_batch(self, batch: int) -> list[dict[str, Any]]:
        """Every width at one batch size. The widths take turns pass by pass, so a machine whose speed drifts
        (a shared CPU, a GPU's clocks) shifts them alike and their ratios stay like for like."""
        widths = self.spec.widths
        timers = {width: self.pass_timer(batch, width) for width in widths}
        for width in widths:
            for _ in range(self.spec.warmup):
                timers[width]()
        times: dict[int, list[float]] = {width: [] for width in widths}
        for turn in range(self.spec.repeats):
            shift = turn % len(widths)
            for width in widths[shift:] + widths[:shift]:
                times[width].append(timers[width]())
        base = statistics.median(times[min(widths)])
        cells = []
        for width in widths:
            ms = statistics.median(times[width])
            cells.append({"batch": batch, "width": width, "ms": ms, "ms_min": min(times[width]),
                          "ms_max": max(times[width]), "ratio": ms / base, "repeats": len(times[width])})
        return cells

    def run(self, on_cell: Callable[[dict[str, Any]], None] | None = None) -> CostResult:
        """Load the target (unless `load` was called), fill the caches and time every cell."""
        import torch

        from adaflash.models.memory import peak_memory_gib

        spec = self.spec
        if self.result is None:
            self.load()
        result = self.result
        assert result is not None
        graphs = "CUDA graphs" if result.cuda_graphs else "eager"
        self.say(f"{spec.target} on {result.hardware}, {result.dtype}, {graphs}: "
                 f"{gigabytes(result.weight_bytes)} of weights read a step; filling "
                 f"{self.passes.max_batch} slots with {spec.context} tokens")
        self.fill()
        if self.on_cuda:
            torch.cuda.reset_peak_memory_stats(self.target.model.device)
        for batch in spec.batch_sizes:
            for cell in self.time_batch(batch):
                result.cells.append(cell)
                if on_cell:
                    on_cell(cell)
        result.peak_memory_gib = peak_memory_gib(self.target.model.device)
        return result


def record(log: Any, bench: CostBench, on_cell: Callable[[dict[str, Any]], None] | None = None
           ) -> tuple[str, CostResult]:
    """Load the target, then measure as a run of the run log (kind "bench", named bench-cost): its settings
    in the config, each cell as metrics `pass_ms_b{B}_k{K}` and `pass_ratio_b{B}_k{K}` (and
    `roofline_share_b{B}`), the whole table in the config's `result`. A target that cannot be loaded or
    does not fit the settings records nothing."""
    import torch

    spec = bench.spec
    bench.load()
    run_id = log.create_run("bench", name=spec.label or "bench-cost", target=spec.target,
                            config=spec.config())
    try:
        result = bench.run(on_cell)
    except torch.OutOfMemoryError as err:
        log.finish_run(run_id, "failed", note="out of memory")
        raise CostBenchError(f"out of memory ({str(err).splitlines()[0]}); lower --batch-sizes, --widths or "
                             "--context") from None
    except BaseException as err:
        log.finish_run(run_id, "stopped" if isinstance(err, KeyboardInterrupt) else "failed",
                       note=f"{type(err).__name__}: {err}")
        raise
    metrics = {}
    for cell in result.cells:
        metrics[f"pass_ms_b{cell['batch']}_k{cell['width']}"] = cell["ms"]
        metrics[f"pass_ratio_b{cell['batch']}_k{cell['width']}"] = cell["ratio"]
    for row in result.roofline():
        if row["share"] is not None:
            metrics[f"roofline_share_b{row['batch']}"] = row["share"]
    log.log_metrics(run_id, metrics)
    log.update_run(run_id, config={**spec.config(), "result": result.as_json()})
    log.finish_run(run_id, "finished", note=summary_note(result))
    return run_id, result


def gigabytes(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e8 else f"{count / 1e6:.1f} MB"


def summary_note(result: CostResult) -> str:
    """'k16/k1 at b1 1.02×, b64 3.10× (hardware)': the curve's ends, per batch."""
    low, high = min(result.spec.widths), max(result.spec.widths)
    ratios = ", ".join(f"b{b} {result.cell(b, high)['ratio']:.2f}×" for b in result.spec.batch_sizes)
    return f"k{high}/k{low}: {ratios} ({result.hardware}, {result.dtype})"
