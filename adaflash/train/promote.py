"""Promote a drafter in training over a shipped one only when held-out prompts show it drafts better.

Why a same-run comparison: τ moves with the prompts, their number, the answer length and the engine's
settings, so a figure from another run says little. Both drafters answer the same held-out prompts
here, one after the other, greedy (every answer is the target's own, so only τ differs), domain by
domain. The candidate replaces the incumbent when its τ, averaged over the domains, beats the
incumbent's by more than `min_gain` and no domain loses more than `domain_slack`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from adaflash.models.drafter_io import DrafterError, export_drafter, load_drafter, staged_folder
from adaflash.models.loading import Target
from adaflash.train.evaluate import eval_tau

KEPT_FILES = ("README.md",)  # the incumbent's model card stays with the folder


@dataclass(frozen=True)
class DomainTau:
    domain: str
    prompts: int
    candidate: float
    incumbent: float

    @property
    def gain(self) -> float:
        return self.candidate - self.incumbent


@dataclass(frozen=True)
class Verdict:
    domains: list[DomainTau]
    promote: bool
    reason: str

    @property
    def candidate(self) -> float:
        return sum(d.candidate for d in self.domains) / len(self.domains)

    @property
    def incumbent(self) -> float:
        return sum(d.incumbent for d in self.domains) / len(self.domains)


def compare(target: Target, candidate: str | Path, incumbent: str | Path, prompts: dict[str, list[str]], *,
            max_new_tokens: int, batch: int) -> list[DomainTau]:
    """τ of both drafters on each domain's prompts (exact prompt strings), in this one run."""
    drafters = [load_drafter(folder, target.model.cfg) for folder in (candidate, incumbent)]
    if drafters[0].kind != drafters[1].kind:
        raise DrafterError(f"{candidate} is a {drafters[0].kind} drafter and {incumbent} a {drafters[1].kind} one: "
                           "promotion compares drafters of one kind")
    rows = []
    for domain, texts in prompts.items():
        taus = [eval_tau(target, d, texts,
                         max_new_tokens=max_new_tokens, batch=batch)["eval_tau"] for d in drafters]
        rows.append(DomainTau(domain, len(texts), taus[0], taus[1]))
    return rows


def decide(domains: list[DomainTau], *, min_gain: float, domain_slack: float) -> Verdict:
    """Promote when the mean τ over domains gains at least `min_gain` and no domain loses more than
    `domain_slack`; the reason says which rule decided."""
    if not domains:
        raise ValueError("no held-out prompts to compare on")
    verdict = Verdict(domains, False, "")
    gain = verdict.candidate - verdict.incumbent
    worst = min(domains, key=lambda d: d.gain)
    if gain <= min_gain:
        return Verdict(domains, False, f"mean τ {verdict.candidate:.3f} against {verdict.incumbent:.3f}: a gain of "
                                       f"{gain:+.3f}, not above {min_gain:.3f}")
    if -worst.gain > domain_slack:
        return Verdict(domains, False, f"{worst.domain} loses {-worst.gain:.3f} τ ({worst.candidate:.3f} against "
                                       f"{worst.incumbent:.3f}), more than --domain-slack {domain_slack:.3f}")
    return Verdict(domains, True, f"mean τ {verdict.candidate:.3f} against {verdict.incumbent:.3f} ({gain:+.3f}); "
                                  f"no domain loses more than {domain_slack:.3f}")


def install(candidate: str | Path, incumbent: str | Path, dtype: torch.dtype | None) -> Path:
    """The candidate's weights (cast to `dtype`) replace the incumbent's in one rename; its model card stays."""
    incumbent = Path(incumbent)
    with staged_folder(incumbent) as tmp:
        exported = export_drafter(candidate, tmp / "drafter", dtype)
        for path in exported.iterdir():
            shutil.move(str(path), tmp / path.name)
        exported.rmdir()
        for name in KEPT_FILES:
            if (incumbent / name).is_file():
                shutil.copy2(incumbent / name, tmp / name)
    return incumbent
