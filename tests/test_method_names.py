"""No method name outside the method table: code asks `adaflash/methods.py` what a method is (its drafter,
its length head, whether it is Vanilla) instead of comparing names, so adding a method is one table row.

The check reads the source with `ast`: a comparison (==, !=, is, in / not in a literal tuple, set or list)
against a method's name, anywhere in adaflash/, jobs/ or tui/ but the table itself, fails. Exempt:
adaflash/models/, where "dflash", "eagle3" and "mtp" name drafter *architectures* (a drafter folder's
`adaflash.method`) that the drafter code dispatches on, and a line that says `# not a method` (a theme, the
program's name).
"""

from __future__ import annotations

import ast
from pathlib import Path

from adaflash.methods import METHOD_NAMES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("adaflash", "jobs", "tui")
TABLE = ROOT / "adaflash" / "methods.py"
ARCHITECTURES = ROOT / "adaflash" / "models"
PRAGMA = "# not a method"
EQUALITY = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)
MEMBERSHIP = (ast.In, ast.NotIn)


def _names_in(node: ast.AST) -> list[str]:
    """Method names written as string literals in `node` (a constant, or a literal tuple/set/list of them)."""
    if isinstance(node, ast.Constant) and node.value in METHOD_NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in METHOD_NAMES]
    return []


def method_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, method name) of each comparison against a method name written out in `source`."""
    hits = []
    exempt = {number for number, line in enumerate(source.splitlines(), 1) if PRAGMA in line}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or node.lineno in exempt:
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if isinstance(op, EQUALITY):
                found = _names_in(left) + _names_in(right)
                hits += [(node.lineno, name) for name in found if not isinstance(left, (ast.Tuple, ast.List))]
            elif isinstance(op, MEMBERSHIP):
                hits += [(node.lineno, name) for name in _names_in(right) if not isinstance(right, ast.Constant)]
                hits += [(node.lineno, name) for name in _names_in(left) if isinstance(left, ast.Constant)]
    return hits


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")
                  if p != TABLE and ARCHITECTURES not in p.parents)


def test_no_method_name_is_compared_outside_the_table() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path in _sources()
             for line, name in method_comparisons(path.read_text(encoding="utf-8"))]
    assert found == [], "compare through adaflash/methods.py (method_of(...).length_head, ...):\n" + "\n".join(found)


def test_the_check_sees_each_form() -> None:
    source = ("a == 'vanilla'\n'osd' != b\nc in ('dflash', 'x')\nd not in {'mtp'}\ne in ['eagle3']\n"
              "'adaflash' in f\ng == 'other'\nh in ('x', 'y')\ni == 'mtp'  # not a method\n")
    assert [line for line, _ in method_comparisons(source)] == [1, 2, 3, 4, 5, 6]
