"""The engine's settings: one frozen, validated group (`adaflash.settings`) that every command's engine
options fill, that travels as JSON to the pipeline's inference worker and that the run log records.

Each field says what it accepts and, when users may set it, its command-line option and help, so a new
engine setting is one field here: `cli/groups.py` makes the click options from these rules. A field
without a flag is for code and tests (the sampling group's `--seed` sets `seed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.engine.params import DEFAULT_LENGTH_POLICY, LENGTH_POLICIES
from adaflash.settings import Rule, Settings, rules_of
from adaflash.settings import setting as _setting

__all__ = ["EngineConfig", "Rule", "engine_rules"]

ADMIT_HELP = ("While requests decode, prefill waiting ones once this many slots are free [default: max-batch/8 on "
              "a GPU, 1 on a CPU]. 1 admits each request at once: lowest time to first token, but on a GPU a full "
              "batch then spends much of its time in eager prefills.")
LENGTH_POLICY_HELP = ("AdaFlash: cost = the width that maximizes expected tokens per second, from step times this "
                      "engine measures as it runs (the whole block, without reading the head, where a shorter verify "
                      "saves nothing); rate = verify round(pred·B·rate) positions (the design card's rule).")
OVERLAP_HELP = ("Launch each greedy step before the host takes the last one's tokens [default: on a GPU, where the "
                "device would otherwise wait for that work; a CPU runs every op as it is called]. --no-overlap "
                "reads each step before launching the next.")


@dataclass(frozen=True)
class EngineConfig(Settings):
    """How an `Engine` runs; None leaves a choice to the engine (it depends on the device)."""

    GROUP: ClassVar[str] = "engine"

    max_batch: int = _setting(16, Rule(int, low=1, flag="--batch-size", aliases=("--max-batch",),
                                       per_command=(("eval", 32),),
                                       help="Requests decoded together (with --engine sglang: "
                                            "--max-running-requests, passed only when given)."))
    max_len: int | None = _setting(None, Rule(int, optional=True, low=16, flag="--context-length", aliases=("--max-len",),
                                              per_command=(("train draft", 512), ("train length-head", 512)),
                                              help="Tokens per sequence (prompt + answer): an engine's slot "
                                                   "[default: min(model context, 4096)], a training row (longer "
                                                   "ones are cut)."))
    length_rate: float = _setting(1.0, Rule(float, low=0, low_open=True, flag="--length-rate",
                                            help="AdaFlash (rate policy): scale on the predicted length."))
    min_length: int = _setting(2, Rule(int, low=1, flag="--min-length", help="AdaFlash: fewest block positions "
                                                                              "verified."))
    length_policy: str = _setting(DEFAULT_LENGTH_POLICY, Rule(str, choices=LENGTH_POLICIES, flag="--length-policy",
                                                              help=LENGTH_POLICY_HELP))
    num_steps: int | None = _setting(None, Rule(int, optional=True, low=1, high=32, flag="--chain-steps",
                                                aliases=("--steps",),
                                                per_command=(("train draft", 6), ("draft new", 6)),
                                                help="Chain drafters (EAGLE-3, MTP): draft steps per pass "
                                                     "[default: the drafter's own]; a new drafter's own."))
    use_length_head: bool | None = _setting(None, Rule(bool, optional=True))  # None: the method's table row says
    verify_length: int | None = _setting(None, Rule(int, optional=True, low=1))  # a fixed verify width (a baseline)
    seed: int = _setting(0, Rule(int))  # the sampler's: the sampling group's --seed
    cuda_graphs: bool | None = _setting(None, Rule(bool, optional=True))
    pad_shapes: bool | None = _setting(None, Rule(bool, optional=True))
    admit_batch: int | None = _setting(None, Rule(int, optional=True, low=1, flag="--admit-batch", help=ADMIT_HELP))
    overlap: bool | None = _setting(None, Rule(bool, optional=True, flag="--overlap/--no-overlap", help=OVERLAP_HELP))


def engine_rules() -> dict[str, Rule]:
    """Every setting's rule, by field name, in declaration order."""
    return rules_of(EngineConfig)
