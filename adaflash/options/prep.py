"""The prep group: how data commands read a source, split, vary and regenerate rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting


@dataclass(frozen=True)
class PrepConfig(Settings):
    GROUP: ClassVar[str] = "prep"

    source: str | None = setting(None, Rule(str, optional=True, flag="--source",
                                            help="Where the data is: a GSM8K folder, a file for a built-in, or the "
                                                 "file when DATASET is a new name."))
    name: str | None = setting(None, Rule(str, optional=True, flag="--name",
                                          help="Output name: <name>_train.jsonl, <name>_test.jsonl [default: from "
                                               "DATASET]."))
    split_seed: int = setting(0, Rule(int, flag="--split-seed", help="Seed of the hash split."))
    test_fraction: float | None = setting(None, Rule(float, optional=True, low=0, high=1, flag="--test-fraction",
                                                     help="Share of rows in test [default: 0.1; 1.0 for humaneval and "
                                                          "mt-bench; official splits are kept]."))
    column_map: str | None = setting(None, Rule(str, optional=True, flag="--column-map", metavar="KEY=COL,...",
                                                help="Columns of a file or hub dataset: prompt=, answer=, id=, "
                                                     "reference=, system=, conversations=."))
    hub_config: str | None = setting(None, Rule(str, optional=True, flag="--hub-config",
                                                help="Config (subset) of a hub dataset."))
    code_packages: str | None = setting(None, Rule(str, optional=True, flag="--code-packages", metavar="NAME,...|none",
                                                   help="suite: installed packages whose documented functions become "
                                                        "code prompts [default: adaflash's own dependencies "
                                                        "(data/code_prompts.py), those installed]."))
    variants: int = setting(3, Rule(int, low=1, high=64, flag="--variants",
                                    help="Redrawn copies per prompt, beside the original."))
    shard: str | None = setting(None, Rule(str, optional=True, flag="--shard", metavar="I/N",
                                           help="Answer only every N-th prompt from the I-th (0-based): N processes or "
                                                "GPUs split one dataset."))
    procs: int = setting(1, Rule(int, low=1, high=64, flag="--procs",
                                 help="Run N processes side by side on the device, each answering every N-th prompt, "
                                      "then write one OUT: one process leaves a GPU mostly idle (on an H200, 8 "
                                      "answered about 6x as many prompts an hour as 1)."))
    compact: bool = setting(False, Rule(bool, flag="--compact",
                                        help="Rows hold the prompt string and the answer's token ids only (what "
                                             "training reads): a third of the size."))
    held_out: str | None = setting(None, Rule(str, optional=True, flag="--held-out", metavar="NAME|FILE,...",
                                              help="Prompts no new prompt may equal (by the hash of its normalized "
                                                   "text): files, or prepared datasets' test splits [default: suite, "
                                                   "when prepared]."))
