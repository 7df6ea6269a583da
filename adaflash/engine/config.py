"""The engine's settings: one frozen, validated dataclass that every command's engine options fill, that
travels as JSON to the pipeline's inference worker and that the run log records.

Each field says what it accepts and, when users may set it, its command-line option and help, so a new
engine setting is one field here: `cli/engine_options.py` makes the click options from these rules. A
field without a flag is for code and tests (the command's own batch option sets `max_batch`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from adaflash.engine.params import DEFAULT_LENGTH_POLICY, LENGTH_POLICIES


@dataclass(frozen=True)
class Rule:
    """What one setting accepts, and its option (`flag`, `help`) where users may set it."""

    kind: type  # int, float, str or bool (a bool is never taken for an int, nor an int for a bool)
    optional: bool = False  # None is accepted: the engine chooses
    low: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    flag: str | None = None  # "--name", or "--name/--no-name" for a bool
    help: str = ""

    def expected(self) -> str:
        if self.choices:
            what = f"one of {', '.join(self.choices)}"
        elif self.kind is bool:
            what = "true or false"
        else:
            what = "an integer" if self.kind is int else "a number"
            if self.low is not None:
                what += f" {'>' if self.low_open else '>='} {self.low:g}"
        return what + (" or null" if self.optional else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.kind is float:
            fits = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        elif self.kind is int:
            fits = isinstance(value, int) and not isinstance(value, bool)
        else:
            fits = isinstance(value, self.kind)
        if not fits or (self.choices and value not in self.choices):
            return False
        return self.low is None or (value > self.low if self.low_open else value >= self.low)


def _setting(default: Any, rule: Rule) -> Any:
    return field(default=default, metadata={"rule": rule})


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
class EngineConfig:
    """How an `Engine` runs; None leaves a choice to the engine (it depends on the device)."""

    max_batch: int = _setting(16, Rule(int, low=1))
    max_len: int | None = _setting(None, Rule(int, optional=True, low=16, flag="--context-length",
                                              help="Tokens per sequence slot (prompt + answer) "
                                                   "[default: min(model context, 4096)]."))
    length_rate: float = _setting(1.0, Rule(float, low=0, low_open=True, flag="--length-rate",
                                            help="AdaFlash (rate policy): scale on the predicted length."))
    min_length: int = _setting(2, Rule(int, low=1, flag="--min-length", help="AdaFlash: fewest block positions "
                                                                              "verified."))
    length_policy: str = _setting(DEFAULT_LENGTH_POLICY, Rule(str, choices=LENGTH_POLICIES, flag="--length-policy",
                                                              help=LENGTH_POLICY_HELP))
    num_steps: int | None = _setting(None, Rule(int, optional=True, low=1, flag="--steps",
                                                help="Chain drafters (EAGLE-3, MTP): draft steps per pass "
                                                     "[default: the drafter's own]."))
    use_length_head: bool | None = _setting(None, Rule(bool, optional=True))  # None: the method's table row says
    verify_length: int | None = _setting(None, Rule(int, optional=True, low=1))  # a fixed verify width (a baseline)
    seed: int = _setting(0, Rule(int, flag="--seed", help="Seed of the engine's sampler (temperature > 0)."))
    cuda_graphs: bool | None = _setting(None, Rule(bool, optional=True))
    pad_shapes: bool | None = _setting(None, Rule(bool, optional=True))
    admit_batch: int | None = _setting(None, Rule(int, optional=True, low=1, flag="--admit-batch", help=ADMIT_HELP))
    overlap: bool | None = _setting(None, Rule(bool, optional=True, flag="--overlap/--no-overlap", help=OVERLAP_HELP))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            rule: Rule = f.metadata["rule"]
            value = getattr(self, f.name)
            if not rule.accepts(value):
                raise ValueError(f"engine setting {f.name} must be {rule.expected()}, got {value!r}")
            if rule.kind is float and value is not None:
                object.__setattr__(self, f.name, float(value))

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> EngineConfig:
        """The config a worker was handed; a key no field has is refused (a launcher of another version)."""
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"engine settings have unknown field(s): {', '.join(unknown)}")
        return cls(**raw)


def engine_rules() -> dict[str, Rule]:
    """Every setting's rule, by field name, in declaration order."""
    return {f.name: f.metadata["rule"] for f in dataclasses.fields(EngineConfig)}
