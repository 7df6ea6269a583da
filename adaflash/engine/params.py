"""What a request asks for and what comes back; shared by the CLI, the server and the workers."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

# How AdaFlash turns the length head's prediction into a verify length (engine/length_policy.py).
LENGTH_POLICIES = ("cost", "rate")
DEFAULT_LENGTH_POLICY = "cost"
_ids = itertools.count()

# Room for the drafted block beyond prompt + max_new_tokens when sizing caches (block sizes and chain steps
# stay ≤ 64).
DRAFT_MARGIN = 72
# top_k goes into an int64 tensor and is clamped to the vocabulary there: any larger value means "all".
MAX_TOP_K = 2**31 - 1
MAX_EXACT_FLOAT_INT = 2**53
MAX_SEED = 2**64 - 1


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_p: float = 0.0  # drop tokens less likely than min_p × the likeliest one (after top-k/top-p)
    seed: int | None = None  # sampled tokens depend only on the seed and their position (sampling.py)

    def validate(self, *, max_new_tokens_limit: int | None = None) -> None:
        """Raise ValueError naming the field; the server turns it into a 400."""
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise ValueError(f"sampling_params.max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if max_new_tokens_limit is not None and self.max_new_tokens > max_new_tokens_limit:
            raise ValueError(f"sampling_params.max_new_tokens={self.max_new_tokens} exceeds the limit {max_new_tokens_limit}")
        if not _finite(self.temperature) or self.temperature < 0:
            raise ValueError(f"sampling_params.temperature must be a finite number >= 0, got {_shown(self.temperature)}")
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"sampling_params.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or not (
                self.top_k == -1 or 1 <= self.top_k <= MAX_TOP_K):
            raise ValueError(f"sampling_params.top_k must be -1 (off) or an integer from 1 to {MAX_TOP_K}, "
                             f"got {_shown(self.top_k)}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("sampling_params.stop must be a list of non-empty strings")
        if not all(isinstance(t, int) for t in self.stop_token_ids):
            raise ValueError("sampling_params.stop_token_ids must be a list of integers")
        if not _finite(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"sampling_params.min_p must be in [0, 1], got {_shown(self.min_p)}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not -MAX_SEED <= self.seed <= MAX_SEED):
            raise ValueError(f"sampling_params.seed must be an integer of at most 64 bits, got {_shown(self.seed)}")

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> SamplingParams:
        """A field given as null takes its default, as in SGLang."""
        raw = {k: v for k, v in (raw or {}).items() if v is not None}
        stop = raw.pop("stop", [])
        if isinstance(stop, str):
            stop = [stop]
        elif not isinstance(stop, list):
            raise ValueError(f"sampling_params.stop must be a string or a list of strings, got {stop!r}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(raw) - known - {"n", "skip_special_tokens", "spaces_between_special_tokens",
                                      "min_new_tokens", "frequency_penalty", "presence_penalty",
                                      "repetition_penalty", "no_stop_trim", "json_schema", "regex"}
        if unknown:
            raise ValueError(f"sampling_params has unknown field(s): {', '.join(sorted(unknown))}")
        params = cls(**{k: v for k, v in raw.items() if k in known}, stop=stop)
        if isinstance(params.temperature, int) and not isinstance(params.temperature, bool):
            if not -MAX_EXACT_FLOAT_INT <= params.temperature <= MAX_EXACT_FLOAT_INT:
                raise ValueError(f"sampling_params.temperature must be a finite number >= 0, got {_shown(params.temperature)}")
            params.temperature = float(params.temperature)
        return params


def _shown(value: Any, limit: int = 40) -> str:
    """A value for an error message, cut short (a request may send a number of a thousand digits)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _finite(value: Any) -> bool:
    """A real number (not a bool) that is neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt_text: str | None = None
    rid: str = field(default_factory=lambda: f"req-{next(_ids)}")
    probe: bool = False  # a health check's request: served, but left out of the engine's statistics


@dataclass
class Output:
    rid: str
    prompt_text: str | None
    prompt_ids: list[int]  # the tokens served: what a trainer learns the answer after
    output_ids: list[int]
    text: str
    meta_info: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "output_ids": self.output_ids, "meta_info": self.meta_info}
