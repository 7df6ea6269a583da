"""The bench group: what a benchmark measures, and how."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting

ENGINE_WARMUPS = ("auto", "short", "full", "none")


def int_list(text: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]; a ValueError for anything else."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError("is empty")
    return [int(item) for item in items]


@dataclass(frozen=True)
class BenchConfig(Settings):
    GROUP: ClassVar[str] = "bench"

    methods: str | None = setting(None, Rule(str, optional=True, flag="--methods",
                                             per_command=(("bench engine", "vanilla"),),
                                             help="Comma-separated methods, e.g. vanilla,dflash,adaflash; Vanilla is "
                                                  "every row's reference."))
    concurrency: str | None = setting("1", Rule(str, optional=True, flag="--concurrency", metavar="N[,N...]",
                                                per_command=(("bench shift", "4"), ("runs import", None)),
                                                help="Requests in flight at most; bench matrix: comma-separated "
                                                     "levels, e.g. 1,32,64; runs import: of every line [default: "
                                                     "max_concurrency]."))
    batch_sizes: str = setting("1", Rule(str, flag="--batch-sizes", per_command=(("bench cost", "1,8,32,64"),),
                                         help="Comma-separated batch sizes, e.g. 1,8,32."))
    warmup: str = setting("1", Rule(str, flag="--warmup", metavar="N|auto|short|full|none",
                                    per_command=(("bench engine", "auto"), ("bench cost", "3")),
                                    help="Unmeasured work first: requests (bench, bench matrix), passes per cell "
                                         "(bench cost; on a GPU the first captures its CUDA graph), or per engine "
                                         "(bench engine) short (a few tokens per slot), full (the measured requests "
                                         "once, so every CUDA graph is captured before timing), none; auto = full "
                                         "on CUDA, short elsewhere."))
    label: str | None = setting(None, Rule(str, optional=True, flag="--label",
                                           help="A name for this result (shown in comparisons)."))
    eval_accuracy: bool = setting(False, Rule(bool, flag="--eval-accuracy",
                                              help="Score answers against the references (GSM8K: last number)."))

    def check(self) -> None:
        text = self.concurrency  # the batch sizes: each command's parser names what it measures
        try:
            bad = text is not None and any(n < 1 for n in int_list(text))
        except ValueError:
            bad = True
        if bad:
            raise self.refuse("concurrency", f"must be comma-separated integers >= 1, got {text!r}")
        if self.warmup not in ENGINE_WARMUPS and not (self.warmup.isdigit()):
            raise self.refuse("warmup", f"must be an integer >= 0 or one of {', '.join(ENGINE_WARMUPS)}, "
                                        f"got {self.warmup!r}")

    @property
    def levels(self) -> list[int]:
        return int_list(self.concurrency) if self.concurrency else []

    @property
    def warmup_count(self) -> int:
        """--warmup as a count (bench, bench matrix, bench cost); a ValueError names the engine's words."""
        if not self.warmup.isdigit():
            raise self.refuse("warmup", f"must be an integer >= 0 here, got {self.warmup!r}")
        return int(self.warmup)
