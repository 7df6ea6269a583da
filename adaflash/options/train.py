"""The train group: how a drafter (or its length head) is trained, offline or by the pipeline's trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting

LOSSES = ("ce", "rkl-mix", "fkl")


@dataclass(frozen=True)
class TrainOptions(Settings):
    GROUP: ClassVar[str] = "train"

    epochs: int = setting(1, Rule(int, low=1, flag="--epochs", help="Passes over the data."))
    steps: int | None = setting(None, Rule(int, optional=True, low=1, flag="--steps",
                                           per_command=(("train length-head", 200),),
                                           help="Training steps: stop after this many (overrides --epochs)."))
    lr: float = setting(3e-4, Rule(float, low=0, low_open=True, flag="--lr",
                                   per_command=(("train length-head", 1e-3), ("pipeline", 1e-4)),
                                   help="Learning rate."))
    warmup_steps: int = setting(10, Rule(int, low=0, flag="--warmup-steps", per_command=(("pipeline", 16),),
                                         help="Training steps over which the learning rate (drafter and length head) "
                                              "ramps up to --lr."))
    batch_tokens: int = setting(4096, Rule(int, low=16, flag="--batch-tokens", help="Tokens per training batch."))
    blocks_per_seq: int = setting(16, Rule(int, low=1, flag="--blocks-per-seq", help="DFlash: anchors per sequence."))
    ttt_length: int = setting(4, Rule(int, low=1, high=16, flag="--ttt-length", help="EAGLE-3/MTP: unrolled steps."))
    loss: str | None = setting("ce", Rule(str, optional=True, choices=LOSSES, flag="--loss",
                                          per_command=(("pipeline", None),),
                                          help="ce = cross-entropy on the target's tokens, rkl-mix = the reverse-KL "
                                               "mixture, fkl = forward KL (pipeline: overrides the preset's)."))
    alpha: float = setting(0.8, Rule(float, low=0, high=1, flag="--alpha", help="rkl-mix: weight of the CE term."))
    kl_temperature: float = setting(1.0, Rule(float, low=0, low_open=True, flag="--kl-temperature",
                                              help="Temperature of the KL terms."))
    clip: float = setting(0.01, Rule(float, low=0, low_open=True, flag="--clip", help="rkl-mix: clip of the KL term."))
    gamma: float = setting(7.0, Rule(float, low=0, low_open=True, flag="--gamma",
                                     help="DFlash: position decay exp(-(k-1)/gamma)."))
    greedy_chain: bool = setting(False, Rule(bool, flag="--greedy-chain",
                                             help="DFlash: each block position learns the target's own greedy token, "
                                                  "and only while the row's answer took the greedy token at every "
                                                  "earlier position of the block: answers sampled at T > 0 (`data "
                                                  "regenerate --temperature`) then widen the contexts without "
                                                  "teaching tokens greedy verification would reject."))
    save_every: int = setting(100, Rule(int, low=1, flag="--save-every", help="Steps between checkpoints."))
    checkpoint: str | None = setting(None, Rule(
        str, optional=True, flag="--checkpoint", metavar="DIR",
        help="The trainer's checkpoint: full-precision weights, optimizer state, schedule and RNG states, in files "
             "of at most 16 MB (easy to carry between machines), apart from the drafter in --out [default: OUT-train "
             "beside --out]. --resume continues from it."))
    eval_every: int = setting(0, Rule(int, low=0, flag="--eval-every",
                                      help="Evaluate τ every N steps; the best evaluated drafter is kept in "
                                           "OUT-best."))
    eval_prompts: int = setting(8, Rule(int, low=0, flag="--eval-prompts", help="Prompts of evaluation τ (0: none)."))
    eval_max_new_tokens: int = setting(64, Rule(int, low=1, flag="--eval-max-new-tokens",
                                                help="New tokens per evaluation answer."))
    schedule_minutes: float | None = setting(None, Rule(
        float, optional=True, low=0, low_open=True, flag="--schedule-minutes",
        help="The learning rate's cosine spans this many minutes of training, counted over every --resume leg "
             "[default: up to the end of this run's --max-minutes]: training split over several time budgets then "
             "follows one schedule (give the total, and each leg's --max-minutes)."))
    feature_memo_gb: float | None = setting(None, Rule(
        float, optional=True, low=0, flag="--feature-memo-gb",
        help="Target features kept between epochs, in GB (each later epoch then runs no target pass for them) "
             "[default: a third of a GPU's free memory, 4 on a CPU]. A corpus larger than it pays a target pass for "
             "the rest in every epoch: tokens_per_s drops, feature_memo_gb says how full."))
    incumbent: str | None = setting(None, Rule(str, optional=True, flag="--over", metavar="DRAFTER",
                                               help="The drafter a promotion may replace: a folder or a built-in "
                                                    "drafter's name (its model card stays)."))
    min_gain: float = setting(0.0, Rule(float, low=0, flag="--min-gain",
                                        help="Promote only when the candidate's τ, averaged over the domains, beats "
                                             "the incumbent's by more than this."))
    domain_slack: float = setting(0.05, Rule(float, low=0, flag="--domain-slack",
                                             help="Promote only when no domain's τ falls by more than this."))
