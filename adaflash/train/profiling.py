"""`train draft --profile DIR`: which kernels (on a CPU, which ops) a training step is made of.

Why: `tokens_per_s` says how fast training goes, not where a step's time goes, and a step is dozens
of kernels and host work between them; only a profile names them. The first `start` steps of the run
warm the allocator (and fill the feature memo with their batches); the next `steps` are recorded with
torch.profiler; the run then goes on unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaflash.bench.profiling import new_profiler, write_profile

TOP_ROWS = 30  # kernels (ops) in the summary table, by their own device (CPU) time


@dataclass
class StepProfiler:
    out: Path
    steps: int = 8
    start: int = 16  # steps of this run before the recording
    on_cuda: bool = False
    seen: int = 0  # steps of this run so far
    recorded: int = 0
    table: Path | None = None  # once written
    _prof: Any = field(default=None, repr=False)
    _began: float = 0.0

    def before_step(self) -> None:
        if self.seen == self.start and self._prof is None and self.table is None:
            self._prof = new_profiler(self.on_cuda)
            self._prof.__enter__()
            self._began = time.perf_counter()

    def after_step(self) -> None:
        self.seen += 1
        if self._prof is not None:
            self.recorded += 1
            if self.recorded >= self.steps:
                self.finish()

    def finish(self) -> Path | None:
        """Stop recording (also when the run ends inside the window) and write the table and the trace."""
        if self._prof is None:
            return self.table
        import torch

        if self.on_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - self._began
        self._prof.__exit__(None, None, None)
        prof, self._prof = self._prof, None
        _, self.table = write_profile(
            prof, self.out, "train", f"{self.recorded} training steps after {self.start}: "
            f"{1000 * seconds / max(self.recorded, 1):.1f} ms a step (wall clock, profiler on); totals are over all "
            f"{self.recorded}", on_cuda=self.on_cuda, rows=TOP_ROWS)
        return self.table
