"""Code prompts in HumanEval's form, written from Python source on this machine: a public function's
signature and docstring, to be completed.

Read from the source text with `ast` (nothing is imported or run). Two sources: the running Python's
standard library (PSF licence), and the installed packages that adaflash depends on or that come with
them (`CODE_PACKAGES`, each under a BSD, MIT or Apache-2.0 licence). The rows therefore depend on the
Python version and the installed package versions; `data prepare suite` records both.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from adaflash.data.builtin_datasets import HUMANEVAL_INSTRUCTION
from adaflash.data.conversations import Row

# package -> licence. sympy, networkx and jinja2 come with torch, pandas and pyarrow with datasets.
# transformers is left out: most of its functions are one model's copy of another's, and reading it
# takes longer than all of these together.
CODE_PACKAGES = {
    "sympy": "BSD-3-Clause", "networkx": "BSD-3-Clause", "numpy": "BSD-3-Clause", "torch": "BSD-3-Clause",
    "pandas": "BSD-3-Clause", "datasets": "Apache-2.0", "pyarrow": "Apache-2.0", "huggingface_hub": "Apache-2.0",
    "textual": "MIT", "rich": "MIT", "click": "BSD-3-Clause", "jinja2": "BSD-3-Clause", "sqlite_utils": "Apache-2.0",
}
DOC_CHARS = (40, 1500)  # docstrings shorter say too little to write the body from; longer ones are manuals


def _stdlib_files() -> Iterator[tuple[str, Path]]:
    """(dotted name, file) of every pure-Python module and package module of the standard library."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    for name in sorted(getattr(sys, "stdlib_module_names", ())):
        if name.startswith("_") or name in ("test", "idlelib", "lib2to3", "turtledemo", "this", "antigravity"):
            continue
        single, package = root / f"{name}.py", root / name
        if single.is_file():
            yield name, single
        elif package.is_dir():
            for path in sorted(package.rglob("*.py")):
                if "test" not in path.parts and not path.name.startswith("_"):
                    yield f"{name}.{path.stem}", path


def _package_files(package: str) -> Iterator[tuple[str, Path]]:
    """(dotted name, file) of a package's public modules, tests and private folders left out."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return
    root = Path(list(spec.submodule_search_locations)[0])
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(p.startswith("_") or p in ("test", "tests", "testing") for p in parts[:-1]):
            continue
        if path.name.startswith("_") or path.name.startswith("test"):
            continue
        yield ".".join([package, *parts[:-1], path.stem]), path


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    """Public top-level functions and public methods of public top-level classes, with their names."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                    yield f"{node.name}.{item.name}", item


def _rows(files: Iterator[tuple[str, Path]], prefix: str) -> Iterator[Row]:
    for module, path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for name, node in _functions(tree):
            doc = ast.get_docstring(node)
            if not doc or not DOC_CHARS[0] <= len(doc) <= DOC_CHARS[1]:
                continue
            signature = f"def {node.name}({ast.unparse(node.args)})" + (
                f" -> {ast.unparse(node.returns)}" if node.returns else "")
            body = "\n".join("    " + line if line else "" for line in doc.splitlines())
            prompt = f'{signature}:\n    """{body.lstrip()}\n    """\n'
            turn = {"role": "user", "content": f"{HUMANEVAL_INSTRUCTION}```python\n{prompt}```"}
            yield {"id": f"{prefix}-{module}.{name}", "domain": "code", "conversations": [turn], "reference": None}


def stdlib_code_rows() -> Iterator[Row]:
    """Prompts from the running Python's standard library."""
    return _rows(_stdlib_files(), "stdlib")


def package_code_rows(packages: dict[str, str] = CODE_PACKAGES) -> Iterator[Row]:
    """Prompts from the installed packages among `packages` (a package that is not installed gives none)."""
    for package in packages:
        yield from _rows(_package_files(package), "pkg")


def chosen_packages(names: str) -> dict[str, str]:
    """`--code-packages`: "a,b" -> {package: licence} (every one installed), "none" -> {}."""
    if names.strip().lower() == "none":
        return {}
    chosen = {}
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if importlib.util.find_spec(name) is None:
            raise ValueError(f"{name} is not installed (names are import names: sqlite_utils, not sqlite-utils)")
        chosen[name] = CODE_PACKAGES.get(name) or _licence(name)
    if not chosen:
        raise ValueError(f"expected package names separated by commas, or none; got {names!r}")
    return chosen


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    """Import name -> the distributions that install it: one scan of the installed packages."""
    return importlib.metadata.packages_distributions()


def _distribution(package: str) -> str:
    """The distribution that installs import name `package` (yaml -> PyYAML)."""
    return (_distributions().get(package) or [package.replace("_", "-")])[0]


def _licence(package: str) -> str:
    try:
        meta = importlib.metadata.metadata(_distribution(package))
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
    value = meta.get("License-Expression") or meta.get("License") or ""
    return (value.strip().splitlines() or ["unknown"])[0][:60]  # some packages put the whole licence text here


def installed_versions(packages: dict[str, str] = CODE_PACKAGES) -> dict[str, dict[str, str]]:
    """package -> its installed version and licence, for the packages found."""
    found = {}
    for package, licence in packages.items():
        if importlib.util.find_spec(package) is None:
            continue
        try:
            version = importlib.metadata.version(_distribution(package))
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        found[package] = {"version": version, "licence": licence}
    return found
