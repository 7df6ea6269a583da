"""What `adaflash bench engine` is asked to run: the spec, its option parsing and the drafters it needs.

Apart from the running (`engine_bench`) because these checks answer the CLI before any model loads,
in the words of the option a bad value came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaflash.engine.config import EngineConfig
from adaflash.methods import METHOD_NAMES, VANILLA, method_of
from adaflash.models.builtin_drafters import builtin_drafter_of
from adaflash.models.registry import resolve_drafter

# Sub-folders of --draft-dir tried for each method, in order. The smollm2-cpu recipe writes {drafters}/dflash,
# .../adaflash-init (offline length head) and .../adaflash-online (the pipeline's newest version, preferred).
DRAFT_SUBDIRS = {"dflash": ("dflash",), "adaflash": ("adaflash", "adaflash-online", "adaflash-init"), "osd": ("osd",),
                 "eagle3": ("eagle3",), "mtp": ("mtp",)}


class EngineBenchError(ValueError):
    """A bad setting or drafter, said in the words of the CLI option it came from."""


@dataclass
class EngineBenchSpec:
    target: str
    methods: list[str]
    batch_sizes: list[int]
    drafts: dict[str, str] = field(default_factory=dict)
    dataset: str = "prompts"
    max_new_tokens: int = 256
    device: str | None = None
    dtype: str | None = None
    compare_hf: bool = False
    prompt_lookup_tokens: int = 10
    label: str | None = None
    warmup: str = "auto"  # auto (full on CUDA, short elsewhere), short, full or none
    # Every engine's settings; each cell sets its own max_batch (a batch size) and max_len (fits the prompts).
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    order: str = "auto"  # auto (interleaved on CPU, sequential on CUDA), interleaved or sequential
    profile: str | None = None  # a folder: after each measured cell, profile its engine's steps there (off the clock)
    profile_steps: int = 32  # engine steps recorded per profile, after as many to fill the batch
    # drafts follow these acceptance shares by position (engine/scripted.py): τ is the script's, not a drafter's
    acceptance: list[float] | None = None
    length_spread: float = 0.0  # each prompt's max_new_tokens drawn by its id (`prompts.answer_budget`)

    def config(self) -> dict[str, Any]:
        return {"bench": "engine", **{k: getattr(self, k) for k in self.__dataclass_fields__},
                "engine_config": self.engine_config.to_json()}


def parse_batch_sizes(text: str) -> list[int]:
    """'1,8,32' → [1, 8, 32] (order kept, duplicates dropped)."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise EngineBenchError("--batch-sizes is empty; give e.g. 1,8,32")
    try:
        sizes = [int(part) for part in items]
    except ValueError:
        raise EngineBenchError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None
    if any(size < 1 for size in sizes):
        raise EngineBenchError(f"--batch-sizes values must be ≥ 1, got {text!r}")
    return list(dict.fromkeys(sizes))


def parse_methods(text: str) -> list[str]:
    """'vanilla,dflash' → methods in the order given, Vanilla first (it is every row's reference)."""
    items = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not items:
        raise EngineBenchError("--methods is empty; give e.g. vanilla,dflash,adaflash")
    unknown = [m for m in items if m not in METHOD_NAMES]
    if unknown:
        raise EngineBenchError(f"--methods: unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHOD_NAMES)}")
    return sorted(items, key=lambda m: m != VANILLA)


def resolve_drafts(methods: list[str], draft_dir: str | None, explicit: dict[str, str],
                   target: str | None = None) -> dict[str, str]:
    """The drafter folder of every method that needs one: --draft METHOD=DIR first, then --draft-dir, then
    the built-in drafter of a built-in target (DFlash, AdaFlash)."""
    drafts: dict[str, str] = {}
    missing = []
    for method in methods:
        if not method_of(method).needs_drafter:
            continue
        if method in explicit:
            drafts[method] = str(resolve_drafter(explicit[method]))
            continue
        found = None
        if draft_dir:
            for sub in DRAFT_SUBDIRS.get(method, (method,)):
                candidate = Path(draft_dir).expanduser() / sub
                if (candidate / "config.json").is_file():
                    found = str(candidate)
                    break
        builtin = builtin_drafter_of(target, method) if target and found is None else None
        if builtin is not None:
            found = str(resolve_drafter(builtin))
        if found is None:
            missing.append(method)
        else:
            drafts[method] = found
    if missing:
        where = (f"--draft-dir {draft_dir} holds no " + " or ".join(
            f"{m}/ ({', '.join(DRAFT_SUBDIRS.get(m, (m,)))})" for m in missing) + "; "
                 if draft_dir else "")
        raise EngineBenchError(f"no drafter for {', '.join(missing)}: {where}give --draft METHOD=DIR for each "
                               "or --draft-dir DIR holding one sub-folder per method")
    for method, folder in drafts.items():
        if not (Path(folder).expanduser() / "config.json").is_file():
            raise EngineBenchError(f"--draft {method}={folder}: no drafter there (no config.json); "
                                   "create one with `adaflash draft new` or `adaflash train draft`, "
                                   "or name a built-in drafter (`adaflash draft builtins`)")
    return drafts
