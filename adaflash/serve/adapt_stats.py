"""τ per drafter version (and per request tag) on an adapting server, and the automatic rollback rule.

Pure bookkeeping, no torch and no I/O, so the rule is tested on its own. τ is always tokens over
verify steps summed over requests (a request's weight is its length), never a mean of per-request τ.

The rollback rule (docs/http-api.md, "Adapting to traffic"): once a new version has finished
`min_requests` requests, compare it with the version it replaced on the same tags. For every tag both
served, take each version's τ over its last `window` requests of that tag; weight the tags by how many
requests the new version served of each. The new version is rolled back when its weighted τ is below
the previous version's by more than `drop` (a fraction: 0.1 = 10%). Tags only one of them served do not
count, so a shift to a new domain is not mistaken for a worse drafter; untagged requests form one tag
(""), which then compares whatever traffic each version saw last. The decision is made once per version.
"""

from __future__ import annotations

from collections import deque
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


class VersionTally:
    """Requests, tokens and verify steps per (drafter version, tag)."""

    def __init__(self) -> None:
        self.served: dict[int, dict[str, Served]] = {}

    def add(self, version: int, tag: str | None, tokens: int, verify: int) -> None:
        if verify <= 0:
            return
        self.served.setdefault(version, {}).setdefault(tag or "", Served()).add(tokens, verify)

    def requests(self, version: int) -> int:
        return sum(s.requests for s in self.served.get(version, {}).values())

    def tau(self, version: int) -> float | None:
        tags = self.served.get(version, {}).values()
        verify = sum(s.verify for s in tags)
        return sum(s.tokens for s in tags) / verify if verify else None

    def as_json(self) -> list[dict[str, Any]]:
        """Per version: requests, τ, and the same per tag (what /get_server_info shows)."""
        return [{"version": version, "requests": self.requests(version), "tau": self.tau(version),
                 "tags": {tag: {"requests": s.requests, "tau": s.tau} for tag, s in sorted(tags.items())}}
                for version, tags in sorted(self.served.items())]


@dataclass(frozen=True)
class RollbackRule:
    min_requests: int = 32
    drop: float = 0.1

    def verdict(self, tally: VersionTally, new: int, previous: int) -> tuple[bool, str] | None:
        """None while too few requests tell; else (roll back?, why)."""
        if tally.requests(new) < self.min_requests:
            return None
        mine, theirs = tally.served.get(new, {}), tally.served.get(previous, {})
        shared = [tag for tag in mine if tag in theirs and mine[tag].recent_tau and theirs[tag].recent_tau]
        weight = sum(mine[tag].requests for tag in shared)
        if not weight:
            return False, f"v{new} kept: v{previous} served none of its tags, nothing to compare"
        new_tau = sum(mine[t].requests * mine[t].recent_tau for t in shared) / weight
        old_tau = sum(mine[t].requests * theirs[t].recent_tau for t in shared) / weight
        worse = new_tau < old_tau * (1.0 - self.drop)
        verb = "rolled back" if worse else "kept"
        return worse, (f"v{new} {verb}: τ {new_tau:.2f} against v{previous}'s {old_tau:.2f} on the same tags "
                       f"over {tally.requests(new)} requests (limit: {100 * self.drop:g}% lower)")
