"""Recipe placeholders: `{vars.NAME}`, `{gpus.ROLE}`, `{nproc.ROLE}` and the run's built-in values.

Built-ins are `{run_id}`, `{run_dir}`, `{workspace}`, `{cache_dir}`, `{recipe_dir}` and `{python}`.
Any other braces are left alone (commands may carry JSON or format strings); an unknown name in
a known namespace is reported to the Checker, with the names that do exist, and so is a brace word
one typo away from a placeholder (`{run_dri}`, `{varz.steps}`), which would otherwise reach the
command as it stands.
"""

from __future__ import annotations

import difflib
import re

from jobs.recipe_checker import Checker

NAMESPACES = ("vars", "gpus", "nproc")
BUILTINS = ("run_id", "run_dir", "workspace", "cache_dir", "recipe_dir", "python")
PLACEHOLDER = re.compile(rf"\{{({'|'.join(NAMESPACES)})\.([A-Za-z0-9_\-]+)\}}|\{{({'|'.join(BUILTINS)})\}}")
BRACE_WORD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(\.[A-Za-z0-9_\-]+)?\}")


def near_miss(text: str) -> tuple[str, str] | None:
    """The first brace word in `text` that looks like a misspelt placeholder, with its likely spelling."""
    for match in BRACE_WORD.finditer(text):
        word, rest = match.group(1), match.group(2)
        if PLACEHOLDER.fullmatch(match.group(0)):
            continue
        choices = NAMESPACES if rest else BUILTINS
        close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
        if close:
            return match.group(0), "{" + close[0] + (rest or "") + "}"
    return None


class Substituter:
    """Fills placeholders in one value; `key` says which recipe key a problem belongs to."""

    def __init__(self, chk: Checker, values: dict[str, dict[str, str]], builtins: dict[str, str]) -> None:
        self.chk, self.values, self.builtins = chk, values, builtins

    def __call__(self, text: str, key: str) -> str:
        def repl(match: re.Match[str]) -> str:
            if match.group(3):
                return self.builtins[match.group(3)]
            space, name = match.group(1), match.group(2)
            table = self.values.get(space, {})
            if name not in table:
                known = ", ".join(sorted(table)) or "none"
                self.chk.add(key, f"unknown placeholder {{{space}.{name}}} (known {space}: {known})")
                return match.group(0)
            return table[name]

        miss = near_miss(text)
        if miss is not None:
            self.chk.add(key, f"unknown placeholder {miss[0]}: did you mean {miss[1]}?")
        return PLACEHOLDER.sub(repl, text)


def resolve_vars(raw: dict[str, str], chk: Checker, builtins: dict[str, str],
                 gpu_values: dict[str, dict[str, str]]) -> dict[str, str]:
    """Vars may use builtins, {gpus.ROLE} and other vars; self-reference and cycles are errors."""
    resolved = dict(raw)

    def lookup(match: re.Match[str], owner: str) -> str:
        if match.group(3):
            return builtins[match.group(3)]
        space, ref = match.group(1), match.group(2)
        if space == "vars":
            return resolved.get(ref, match.group(0)) if ref != owner else match.group(0)
        return gpu_values.get(space, {}).get(ref, match.group(0))

    for _ in range(len(raw) + 1):
        changed = False
        for name, text in resolved.items():
            new = PLACEHOLDER.sub(lambda m, name=name: lookup(m, name), text)
            if new != text:
                resolved[name], changed = new, True
        if not changed:
            break
    for name, text in resolved.items():
        for match in PLACEHOLDER.finditer(text):
            chk.add(f"vars.{name}", f"unresolvable placeholder {match.group(0)} (unknown or circular)")
        if (miss := near_miss(raw[name])) is not None:
            chk.add(f"vars.{name}", f"unknown placeholder {miss[0]}: did you mean {miss[1]}?")
    return resolved
