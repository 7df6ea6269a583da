"""The job group: where a command writes, how long it may run, what it may replace; and profiling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting


@dataclass(frozen=True)
class JobConfig(Settings):
    GROUP: ClassVar[str] = "job"

    out: str | None = setting(None, Rule(str, optional=True, flag="--out", metavar="PATH",
                                         help="Where the result is written: a folder (drafters, models, data prepare "
                                              "[default: <workspace>/data]) or a file (data vary/regenerate: JSONL, "
                                              "gzip-compressed when it ends in .gz; bench cost: the plot, .png or "
                                              ".svg), replaced atomically."))
    output_file: str | None = setting(None, Rule(str, optional=True, flag="--output", aliases=("-o",), metavar="FILE",
                                                 help="Write here instead of stdout (-o FILE)."))
    workspace: str | None = setting(None, Rule(str, optional=True, flag="--workspace", envvar="ADAFLASH_WORKSPACE",
                                               help="Workspace folder holding the run log and runs [env "
                                                    "ADAFLASH_WORKSPACE; default ./adaflash-workspace; run: the "
                                                    "global one, else the recipe's]."))
    max_minutes: float | None = setting(None, Rule(
        float, optional=True, low=0, low_open=True, flag="--max-minutes",
        help="Time budget in minutes. train: stop, evaluate and save (the learning rate's cosine ends with it, so "
             "the saved drafter is an annealed one); data regenerate: start no new prompt, finish those in flight, "
             "write the rows and leave the rest to --resume; pipeline: inference stops taking prompts and the "
             "trainers publish a final version and exit."))
    resume: bool = setting(False, Rule(bool, flag="--resume",
                                       help="Continue what an earlier run left: train from its trainer checkpoint "
                                            "(--checkpoint), bit for bit; data regenerate keeps the rows in OUT.partial and answers "
                                            "only the others."))
    force: bool = setting(False, Rule(bool, flag="--force", help="Replace what is already there (a cached model "
                                                                  "copy, a folder in --out)."))
    dry_run: bool = setting(False, Rule(bool, flag="--dry-run",
                                        help="Print what would run (command lines, GPUs, configuration) and stop."))
    max_shard_gb: float = setting(4.0, Rule(float, low=0, low_open=True, flag="--max-shard-gb",
                                            help="Largest safetensors shard in GB; several shards come with "
                                                 "model.safetensors.index.json."))
    interval: float = setting(2.0, Rule(float, low=0.1, flag="--interval", per_command=(("runs attach", 0.5),),
                                        help="Seconds between refreshes."))


@dataclass(frozen=True)
class ProfileConfig(Settings):
    GROUP: ClassVar[str] = "profile"

    profile: str | None = setting(None, Rule(str, optional=True, flag="--profile", metavar="DIR",
                                             help="Record steps with torch.profiler (off the clock) into this folder: "
                                                  "*.top.txt (the kernels, or on a CPU the ops, by their own time) "
                                                  "and a Chrome trace; bench engine also its first step, the prefill "
                                                  "(*-prefill.top.txt)."))
    profile_steps: int = setting(8, Rule(int, low=1, flag="--profile-steps", per_command=(("bench engine", 32),),
                                         help="Steps each profile records (bench engine: after as many that fill "
                                              "the batch)."))
    profile_after: int = setting(16, Rule(int, low=0, flag="--profile-after",
                                          help="Steps of this run before --profile records: past the first epoch, "
                                               "the target's features come from the memo and a step is the "
                                               "drafter's alone."))
