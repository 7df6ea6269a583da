"""The inputs group: where prompts and rows come from, and how many."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting

DATASET_HELP = ("A prepared dataset's name (gsm8k, humaneval, mt-bench, sharegpt, suite: <workspace>/data/NAME_SPLIT"
                ".jsonl; the train split for data vary/regenerate, else test) or a JSONL file of normalized or "
                "{\"prompt\": ...} rows; a filter in runs list; the dataset of every line in runs import.")


@dataclass(frozen=True)
class InputConfig(Settings):
    GROUP: ClassVar[str] = "inputs"

    dataset: str | None = setting(None, Rule(str, optional=True, flag="--dataset", help=DATASET_HELP))
    datasets: str | None = setting(None, Rule(str, optional=True, flag="--datasets",
                                              help="Comma-separated datasets (prepared names or FILE.jsonl)."))
    prompt: tuple[str, ...] = setting((), Rule(str, multiple=True, flag="--prompt", help="A prompt (repeatable)."))
    prompts: str | None = setting(None, Rule(str, optional=True, flag="--prompts",
                                             per_command=(("bench engine", "gsm8k"),),
                                             help="Prompts: a JSONL file ({\"prompt\": ...} or normalized rows), or "
                                                  "(bench engine) a prepared dataset's name; rows with a `domain` "
                                                  "(the suite) are measured per domain."))
    data: tuple[str, ...] = setting((), Rule(str, multiple=True, flag="--data",
                                             help="Training prompts or rows (regenerated: prompt_text + response; or "
                                                  "normalized conversations), or a prepared dataset's name (its "
                                                  "train split). train: repeat it to train on several files as one "
                                                  "corpus; pipeline: one."))
    eval_data: str | None = setting(None, Rule(str, optional=True, flag="--eval-data",
                                               help="Held-out rows for evaluation τ, or a prepared dataset's name "
                                                    "(its test split)."))
    num_prompts: int = setting(32, Rule(int, low=1, flag="--num-prompts",
                                        per_command=(("bench", 64), ("bench matrix", 16), ("bench shift", 1000)),
                                        help="Prompts measured (per domain for the suite; bench shift: per phase "
                                             "at most, held-out ones included)."))
    num_samples: int | None = setting(None, Rule(int, optional=True, low=1, flag="--num-samples",
                                                 help="Take the first N prompts [default: all]."))
    skip: int = setting(0, Rule(int, low=0, flag="--skip",
                                help="Leave out the first N prompts (e.g. those a drafter was already trained on)."))
    limit: int | None = setting(None, Rule(int, optional=True, low=1, flag="--limit", per_command=(("runs list", 50),),
                                           help="Read at most this many rows (per split where the source has an "
                                                "official split; runs list: runs listed)."))
