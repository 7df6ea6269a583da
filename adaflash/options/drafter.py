"""The drafter group: the shape of a drafter a command builds or trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting


@dataclass(frozen=True)
class DrafterConfig(Settings):
    GROUP: ClassVar[str] = "drafter"

    init: str | None = setting(None, Rule(str, optional=True, flag="--init",
                                          help="Start from this drafter: a folder or a built-in drafter's name "
                                               "(`adaflash draft builtins`)."))
    layers: int | None = setting(1, Rule(int, optional=True, low=1, flag="--layers", per_command=(("models synth", None),),
                                         help="Decoder layers: a new drafter's depth (at most 8; given with --init, a "
                                              "DFlash drafter is deepened to it: each new layer starts adding "
                                              "nothing); models synth: instead of the architecture's own."))
    block_size: int | None = setting(None, Rule(int, optional=True, low=2, high=64, flag="--block-size",
                                                per_command=(("draft new", 16),),
                                                help="DFlash block (drafted tokens + 1) [default: 16, or the "
                                                     "drafter's]; given with --init, the drafter is trained at this "
                                                     "block (its weights do not depend on it); with --engine sglang: "
                                                     "--speculative-dflash-block-size."))
    length_head: bool | None = setting(False, Rule(bool, optional=True, flag="--length-head/--no-length-head",
                                                   per_command=(("pipeline", None),),
                                                   help="DFlash: the AdaFlash length head (add it, train it jointly; "
                                                        "pipeline: overrides the preset)."))
    target_layer_ids: str | None = setting(None, Rule(str, optional=True, flag="--target-layer-ids",
                                                      help="Comma-separated target layers to read (default: spread "
                                                           "evenly)."))
    mask_token_id: int | None = setting(None, Rule(int, optional=True, flag="--mask-token-id",
                                                   help="DFlash: a spare token id for MASK (default: a learned "
                                                        "embedding)."))
    draft_vocab: int | None = setting(None, Rule(int, optional=True, low=16, flag="--draft-vocab",
                                                 help="Score only the N most frequent tokens of --data (a draft "
                                                      "vocabulary): drafting and training cost N/V of the full "
                                                      "lm_head. Default: the whole vocabulary, or the --init "
                                                      "drafter's; given with --init, its vocabulary is chosen anew."))
    init_from_target: bool = setting(False, Rule(bool, flag="--init-from-target/--random-init",
                                                 help="A new drafter copies the target layers after its deepest "
                                                      "feature layer (not with --init)."))
