"""How a recipe command becomes the argv that is started.

Recipes write `adaflash ...` and `python ...`; those must run with this interpreter's
environment even when the venv is not activated, both directly and under torchrun (locally and
in a Slurm script).
"""

from __future__ import annotations

import sys
from pathlib import Path

ADAFLASH_MODULE = "adaflash.cli.main"
PROGRAM = "adaflash"  # the console script (a command line's first word), not the method


def resolve_head(argv: list[str], python: str | None = None) -> list[str]:
    """`adaflash ...` -> this interpreter's adaflash; `python ...` -> this interpreter."""
    python = python or sys.executable
    if not argv:
        return argv
    if argv[0] == PROGRAM:
        return [python, "-m", ADAFLASH_MODULE, *argv[1:]]
    if argv[0] in ("python", "python3"):
        return [python, *argv[1:]]
    return list(argv)


def torchrun_launcher(python: str | None = None) -> list[str]:
    """torchrun of this interpreter's environment (works in an unactivated venv)."""
    python = python or sys.executable
    script = Path(python).with_name("torchrun")
    return [str(script)] if script.exists() else [python, "-m", "torch.distributed.run"]


def torchrun_tail(argv: list[str], python: str | None = None) -> list[str]:
    """What follows torchrun's own flags: `-m module ...`, `script.py ...`, or `--no-python cmd ...`."""
    if argv and argv[0] == PROGRAM:
        return ["-m", ADAFLASH_MODULE, *argv[1:]]
    if argv and argv[0] in ("python", "python3", sys.executable):
        rest = argv[1:]
        if rest and rest[0] == "-m":
            return ["-m", *rest[1:]]
        if rest and not rest[0].startswith("-"):
            return rest  # a script
        return ["--no-python", python or sys.executable, *rest]  # python -c ... and other flags
    return ["--no-python", *argv]
