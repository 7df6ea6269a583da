"""What each decoding method is, in one table: every command, the engine, the SGLang launcher, the benchmark
comparison and the dashboard read it here, so they cannot disagree on what a method needs.

Torch-free on purpose: the control plane (`jobs`) and the dashboard (`tui`) import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DrafterKind = Literal["block", "chain", "none"]


@dataclass(frozen=True)
class Method:
    """One decoding method.

    `drafter` is the drafter architecture it runs (a drafter folder's `adaflash.method`: dflash, eagle3 or
    mtp); `kind` how that drafter proposes (a whole block per pass, or a chain of single tokens).
    `length_head`: the method needs a drafter with an AdaFlash length head and lets it choose verify lengths
    (on SGLang: the dynamic-verify flags). `sglang_algorithm` is SGLang's `--speculative-algorithm` (None:
    no speculation); `sglang_draft_optional`: SGLang runs it without a draft model (NEXTN on the target's
    own MTP layers).
    """

    name: str
    display: str
    kind: DrafterKind
    drafter: str | None
    length_head: bool = False
    sglang_algorithm: str | None = None
    sglang_draft_optional: bool = False

    @property
    def needs_drafter(self) -> bool:
        """On the embedded engine: every method but Vanilla runs a drafter."""
        return self.drafter is not None

    def needs_draft_on(self, engine: str) -> bool:
        """Whether a drafter must be given to run it on `engine` (embedded or sglang)."""
        return self.needs_drafter and not (engine == "sglang" and self.sglang_draft_optional)


TABLE: tuple[Method, ...] = (
    Method("vanilla", "Vanilla", "none", None),
    Method("dflash", "DFlash", "block", "dflash", sglang_algorithm="DFLASH"),
    Method("adaflash", "AdaFlash", "block", "dflash", length_head=True, sglang_algorithm="DFLASH"),
    Method("eagle3", "EAGLE-3", "chain", "eagle3", sglang_algorithm="EAGLE3"),
    Method("mtp", "MTP", "chain", "mtp", sglang_algorithm="NEXTN", sglang_draft_optional=True),
    Method("osd", "OSD", "block", "dflash", sglang_algorithm="DFLASH"),
)
METHOD_NAMES: tuple[str, ...] = tuple(m.name for m in TABLE)
VANILLA = TABLE[0].name  # the reference every speed-up is measured against
# Names for code that means one method (a default, a baseline); what a method *does* is asked of its row.
_, DFLASH, ADAFLASH, EAGLE3, MTP, OSD = METHOD_NAMES
SPECULATIVE_NAMES: tuple[str, ...] = tuple(m.name for m in TABLE if m.needs_drafter)
# The drafter architectures, in the table's order (what `adaflash draft new --method` makes).
DRAFTER_ARCHITECTURES: tuple[str, ...] = tuple(dict.fromkeys(m.drafter for m in TABLE if m.drafter))
# The methods whose drafters the on-policy loop trains (`pipeline`, `serve --adapt`): DFlash drafters.
ONLINE_TRAINABLE: tuple[str, ...] = tuple(m.name for m in TABLE if m.drafter == "dflash")
# Their drafter architectures: what `pipeline --draft` and `serve --adapt` accept.
ONLINE_DRAFTERS: tuple[str, ...] = tuple(dict.fromkeys(m.drafter for m in TABLE if m.name in ONLINE_TRAINABLE and m.drafter))
# The drafter architectures that carry an AdaFlash length head.
LENGTH_HEAD_DRAFTERS: tuple[str, ...] = tuple(dict.fromkeys(m.drafter for m in TABLE if m.length_head and m.drafter))
# Older SGLang spellings a server_info may report, and the algorithm they mean.
SGLANG_ALIASES = {"EAGLE": "EAGLE3"}
_BY_NAME = {m.name: m for m in TABLE}


class UnknownMethodError(ValueError):
    """A method name that is not in the table."""


def method_of(name: str, option: str = "--method") -> Method:
    """The method called `name`; the error names the option and the valid methods."""
    found = _BY_NAME.get(name)
    if found is None:
        raise UnknownMethodError(f"{option} must be one of {', '.join(METHOD_NAMES)}, got {name!r}")
    return found


def display_name(name: str) -> str:
    """How a method is written for people (EAGLE-3, AdaFlash); an unknown name as it is."""
    found = _BY_NAME.get(name)
    return found.display if found else name


def plain_method_for(drafter: str) -> Method:
    """The method that runs a drafter architecture as it is (no length head): the first in the table."""
    return next(m for m in TABLE if m.drafter == drafter and not m.length_head)


def sglang_algorithms() -> tuple[str, ...]:
    """Every `speculative_algorithm` a server_info may report that names a method, each alias after its own."""
    names = dict.fromkeys(m.sglang_algorithm for m in TABLE if m.sglang_algorithm)
    return tuple(n for name in names for n in (name, *(a for a, to in SGLANG_ALIASES.items() if to == name)))


def method_for_algorithm(algorithm: str | None) -> Method | None:
    """The method a SGLang server runs, from its `speculative_algorithm` (None: Vanilla); None when unknown.

    DFlash, AdaFlash and OSD all report DFLASH: the answer is the plain method, DFlash.
    """
    if algorithm is None:
        return _BY_NAME[VANILLA]
    wanted = SGLANG_ALIASES.get(algorithm.upper(), algorithm.upper())
    return next((m for m in TABLE if m.sglang_algorithm == wanted and not m.length_head), None)
