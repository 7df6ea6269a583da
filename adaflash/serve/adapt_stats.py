"""τ per drafter version (and per request tag) on an adapting server, and the automatic rollback rule.

Pure bookkeeping, no torch and no I/O, so the rule is tested on its own. τ is always tokens over
verify steps summed over requests (a request's weight is its length), never a mean of per-request τ.

The rollback rule (docs/http-api.md, "Adapting to traffic"): once a new version has finished
`min_requests` requests, compare it with the reference version on the same tags. For every tag both
served, take each version's τ over its last `window` requests of that tag; weight the tags by how many
requests the new version served of each. The new version is rolled back when its weighted τ is below
the reference's by more than `drop` (a fraction: 0.1 = 10%). Tags only one of them served do not
count, so a shift to a new domain is not mistaken for a worse drafter; untagged requests form one tag
(""), which then compares whatever traffic each version saw last. The decision is made once per version;
versions that replace each other before enough requests arrive are judged together, and a group
accepted measures the reference it leaves (its newest version) with all its requests.

With `held_out`, only requests on held-out prompts count (prompts no version trains on): a trainer
that memorizes repeated prompts raises τ on those and lowers it everywhere else, and only held-out
prompts show that. The reference is the best version accepted so far, not the last one, so a drift
down in small steps, each within `drop`, cannot carry the server away from it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

WINDOW = 256  # requests per (version, tag) kept for the comparison


@dataclass
class Served:
    """What one version served of one tag: totals, and the last requests' (tokens, verify steps)."""

    requests: int = 0
    tokens: int = 0
    verify: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add(self, tokens: int, verify: int) -> None:
        self.requests += 1
        self.tokens += tokens
        self.verify += verify
        self.recent.append((tokens, verify))

    @property
    def tau(self) -> float | None:
        return self.tokens / self.verify if self.verify else None

    @property
    def recent_tau(self) -> float | None:
        verify = sum(v for _, v in self.recent)
        return sum(t for t, _ in self.recent) / verify if verify else None

    @classmethod
    def merged(cls, parts: list[Served]) -> Served:
        """Several versions' record of one tag as one (their last requests, in version order)."""
        whole = cls(requests=sum(p.requests for p in parts), tokens=sum(p.tokens for p in parts),
                    verify=sum(p.verify for p in parts))
        for part in parts:
            whole.recent.extend(part.recent)
        return whole


class VersionTally:
    """Requests, tokens and verify steps per (drafter version, tag): all requests, and those on held-out prompts."""

    def __init__(self) -> None:
        self.served: dict[int, dict[str, Served]] = {}
        self.held_out: dict[int, dict[str, Served]] = {}

    def add(self, version: int, tag: str | None, tokens: int, verify: int, *, held_out: bool = False) -> None:
        if verify <= 0:
            return
        books = (self.served, self.held_out) if held_out else (self.served,)
        for book in books:
            book.setdefault(version, {}).setdefault(tag or "", Served()).add(tokens, verify)

    def requests(self, version: int, *, held_out: bool = False) -> int:
        book = self.held_out if held_out else self.served
        return sum(s.requests for s in book.get(version, {}).values())

    def tau(self, version: int, *, held_out: bool = False) -> float | None:
        tags = (self.held_out if held_out else self.served).get(version, {}).values()
        verify = sum(s.verify for s in tags)
        return sum(s.tokens for s in tags) / verify if verify else None

    def as_json(self) -> list[dict[str, Any]]:
        """Per version: requests, τ, the same per tag, and on held-out prompts (what /get_server_info shows)."""
        return [{"version": version, "requests": self.requests(version), "tau": self.tau(version),
                 "tags": {tag: {"requests": s.requests, "tau": s.tau} for tag, s in sorted(tags.items())},
                 "held_out": {"requests": self.requests(version, held_out=True),
                              "tau": self.tau(version, held_out=True)}}
                for version, tags in sorted(self.served.items())]


@dataclass(frozen=True)
class Verdict:
    worse: bool  # roll back to the reference
    better: bool  # at least as good as the reference, or nothing to compare: it becomes the reference
    why: str


@dataclass(frozen=True)
class RollbackRule:
    min_requests: int = 32
    drop: float = 0.1
    held_out: bool = False  # judge on requests on held-out prompts only

    def verdict(self, tally: VersionTally, new: int | Sequence[int],
                reference: int | Sequence[int]) -> Verdict | None:
        """None while too few requests tell; else the verdict on `new` against `reference`.

        `new` may be several versions, served one after the other since the reference: a trainer that
        publishes faster than `min_requests` arrive has each replaced before it could be judged alone,
        so they are judged together (the newest stands for them). `reference` likewise: the group that
        was accepted, whose newest is the reference version (its own few requests would be noise)."""
        group, accepted = _versions(new), _versions(reference)
        count = sum(tally.requests(v, held_out=self.held_out) for v in group)
        if count < self.min_requests:
            return None
        book = tally.held_out if self.held_out else tally.served
        mine, theirs = _merged(book, group), _merged(book, accepted)
        name = _name(group)
        shared = [tag for tag in mine if tag in theirs and mine[tag].recent_tau and theirs[tag].recent_tau]
        weight = sum(mine[tag].requests for tag in shared)
        if not weight:
            return Verdict(False, True, f"{name} kept: {_name(accepted)} served none of its tags, nothing to compare")
        new_tau = sum(mine[t].requests * mine[t].recent_tau for t in shared) / weight
        old_tau = sum(mine[t].requests * theirs[t].recent_tau for t in shared) / weight
        worse = new_tau < old_tau * (1.0 - self.drop)
        verb = "rolled back" if worse else "kept"
        where = "held-out prompts of the same tags" if self.held_out else "the same tags"
        return Verdict(worse, new_tau >= old_tau,
                       f"{name} {verb}: τ {new_tau:.2f} against {_name(accepted)}'s {old_tau:.2f} on {where} "
                       f"over {count} requests (limit: {100 * self.drop:g}% lower)")


def _versions(given: int | Sequence[int]) -> list[int]:
    return [given] if isinstance(given, int) else sorted(given)


def _name(group: list[int]) -> str:
    return f"v{group[0]}" if len(group) == 1 else f"v{group[0]}-v{group[-1]}"


def _merged(book: dict[int, dict[str, Served]], group: list[int]) -> dict[str, Served]:
    """The group's record per tag, as if one version had served it all."""
    tags = sorted({tag for v in group for tag in book.get(v, {})})
    return {tag: Served.merged([book[v][tag] for v in group if tag in book.get(v, {})]) for tag in tags}
