"""The sampling group: how answers are drawn and how prompts are rendered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting

PROMPT_SEED = ("bench", "bench matrix", "bench engine")  # their seed samples prompts: none = the first N


@dataclass(frozen=True)
class SamplingConfig(Settings):
    GROUP: ClassVar[str] = "sampling"

    max_new_tokens: int = setting(256, Rule(int, low=1, high=32768, flag="--max-new-tokens",
                                            per_command=(("generate", 128), ("data ask", 96)),
                                            help="New tokens per answer at most."))
    temperature: float = setting(0.0, Rule(float, low=0, flag="--temperature", per_command=(("data ask", 0.9),),
                                           help="0: greedy."))
    top_p: float = setting(1.0, Rule(float, low=0, low_open=True, high=1, flag="--top-p",
                                     help="Nucleus sampling (temperature > 0)."))
    top_k: int = setting(-1, Rule(int, low=-1, flag="--top-k", help="Sample among the k likeliest (-1: all)."))
    stop: tuple[str, ...] = setting((), Rule(str, multiple=True, flag="--stop", help="Stop string (repeatable)."))
    chat: bool = setting(True, Rule(bool, flag="--chat/--no-chat",
                                    help="Apply the target's chat template (bench: client-side, so the server "
                                         "gets the exact text)."))
    seed: int | None = setting(0, Rule(int, optional=True, flag="--seed",
                                       per_command=tuple((name, None) for name in PROMPT_SEED),
                                       help="Seed of the command's draws: the engine's sampler (temperature > 0), "
                                            "the prompts sampled (bench: none = the first N), data vary's "
                                            "numbers, a new model's or drafter's weights, training's order."))
