"""The job graph: each job names the jobs it comes `after`; these answer order, cycles and ancestry.

A graph is a mapping job -> the jobs it waits for. Names a job waits for that are not in the
mapping are ignored here: the recipe checks report them as unknown jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def topo_order(deps: Mapping[str, Iterable[str]]) -> list[str]:
    """Kahn's order, stable in insertion order; raises ValueError on a cycle."""
    remaining = {n: [d for d in ds if d in deps] for n, ds in deps.items()}
    order: list[str] = []
    while remaining:
        ready = [n for n, ds in remaining.items() if all(d in order for d in ds)]
        if not ready:
            raise ValueError(f"dependency cycle among {', '.join(remaining)}")
        for n in ready:
            order.append(n)
            del remaining[n]
    return order


def find_cycle(deps: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One dependency cycle as a path a -> b -> a, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in deps.get(node, ()):
            if dep not in deps:
                continue
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in deps:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def ancestors_of(deps: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """Every job each job waits for, directly or through others (so it never overlaps them)."""
    out: dict[str, set[str]] = {}

    def walk(node: str, seen: set[str]) -> set[str]:
        if node in out:
            return out[node]
        result: set[str] = set()
        for dep in deps.get(node, ()):
            if dep in deps and dep not in seen:
                result.add(dep)
                result |= walk(dep, seen | {dep})
        out[node] = result
        return result

    for node in deps:
        walk(node, {node})
    return out
