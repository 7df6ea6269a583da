"""The pipeline group: the on-policy pipeline's workers, buffer and versions (`serve --adapt` shares the swap
dir's and the trainer's GPUs' rules)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.pipeline.presets import PRESETS
from adaflash.settings import Rule, Settings, setting

SWAP_DIR = Rule(str, optional=True, flag="--swap-dir", metavar="DIR",
                help="A pipeline's swap dir: its trajectories (buffer) and published versions [pipeline: "
                     "RUN_DIR/swap; serve --adapt: WORKSPACE/adapt, where a restart serves its newest valid version "
                     "and the trainer resumes after what it learned]; pipeline export and status read it directly.")
TRAIN_GPUS = Rule(str, flag="--train-gpus", help="The trainer's GPUs (indices; several: torchrun) or 'cpu'.")


@dataclass(frozen=True)
class PipelineOptions(Settings):
    GROUP: ClassVar[str] = "pipeline"

    preset: str | None = setting(None, Rule(str, optional=True, choices=tuple(sorted(PRESETS)), flag="--preset",
                                            help="adaflash = reverse-KL mixture + length head; osd = forward KL, "
                                                 "no head."))
    infer_gpus: str = setting("cpu", Rule(str, flag="--infer-gpus", help="'cpu' or GPU indices for the inference "
                                                                          "worker."))
    train_gpus: str = setting("cpu", TRAIN_GPUS)
    train_procs: int | None = setting(None, Rule(int, optional=True, low=1, flag="--train-procs",
                                                 help="Training processes on CPU (torchrun, gloo) [default: 1]; on "
                                                      "GPUs it is one per training GPU."))
    swap_dir: str | None = setting(None, SWAP_DIR)
    lr_decay_minutes: float = setting(0.0, Rule(float, low=0, flag="--lr-decay-minutes",
                                                help="With --max-minutes: the budget's last M minutes anneal the "
                                                     "learning rate linearly to zero (warmup-stable-decay), so the "
                                                     "final version is a settled one."))
    max_samples: int | None = setting(None, Rule(int, optional=True, low=1, flag="--max-samples",
                                                 help="Stop after this many trajectories (without --loop, at most "
                                                      "one per prompt)."))
    loop: bool | None = setting(None, Rule(bool, optional=True, flag="--loop/--no-loop",
                                           help="Cycle over the data until stopped [default: on with --max-minutes, "
                                                "else off]."))
    duration: float | None = setting(None, Rule(float, optional=True, low=0, low_open=True, flag="--duration",
                                                 help="Inference stops taking prompts this many seconds after it "
                                                      "starts; the trainers then drain the buffer."))
    min_buffer: int = setting(8, Rule(int, low=1, flag="--min-buffer", help="Trajectories buffered before training "
                                                                            "starts."))
    train_batch: int = setting(8, Rule(int, low=1, flag="--train-batch", help="Trajectories per training step."))
    publish_every: int = setting(2, Rule(int, low=1, flag="--publish-every", help="Steps between versions."))
    keep: int = setting(3, Rule(int, low=1, flag="--keep", help="Versions kept on disk."))
    version: int | None = setting(None, Rule(int, optional=True, low=1, flag="--version",
                                             help="A kept version [default: the newest]."))
