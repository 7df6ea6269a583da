"""The Launch form's fields read and checked as the jobs they become will use them.

Why apart from `launch_plan`: reading a typed field (an integer, a time budget, `method=DIR` pairs)
and warning about a path that is not there yet are one idea; which commands a launch means is another.
Errors refuse the launch; warnings only inform (a dataset or drafter may be made by an earlier job).
What is not there now is also recorded as `Missing`: a launch from the form has no earlier job, so
`launch_plan.build` refuses it, and offers to prepare a built-in dataset that is only not prepared yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from adaflash.data.builtin_datasets import BUILTIN_DATASETS
from adaflash.data.prompts import PromptFileError, prompt_source
from adaflash.methods import VANILLA
from adaflash.models.builtin_drafters import BUILTIN_DRAFTERS

PREPARABLE = (*BUILTIN_DATASETS, "suite")  # what `adaflash data prepare NAME` makes with no other argument


@dataclass(frozen=True)
class Missing:
    """A path a job reads that is not there now: the job would exit 2 at its start."""

    warning: str  # as the recipe's warnings say it (an earlier job of a recipe may create it)
    error: str  # as a launch from the form says it (nothing runs before its one job)
    dataset: str | None = None  # a built-in dataset `adaflash data prepare NAME` would make


def integer(text: str, what: str, errors: list[str], *, low: int = 1, high: int | None = None,
            optional: bool = False) -> int | None:
    """An integer in [low, high]; None (with an error unless `optional` and empty) otherwise."""
    text = text.strip()
    if not text:
        if not optional:
            errors.append(f"{what}: required (an integer >= {low})")
        return None
    try:
        value = int(text)
    except ValueError:
        errors.append(f"{what}: expected an integer, got {text!r}")
        return None
    if value < low or (high is not None and value > high):
        errors.append(f"{what}: expected {low}..{high if high is not None else '∞'}, got {value}")
        return None
    return value


def minutes(text: str, errors: list[str]) -> float | None:
    """An optional positive number of minutes (a time budget)."""
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        errors.append(f"max minutes: expected a number of minutes, got {text!r}")
        return None
    if not value > 0 or value == float("inf"):
        errors.append(f"max minutes: expected a number > 0, got {text}")
        return None
    return value


def drafts_of(text: str, methods: tuple[str, ...], errors: list[str]) -> list[str]:
    """`DIR` (every non-vanilla method) or `method=DIR,method=DIR` -> bench matrix `--draft` values."""
    text = text.strip()
    if not text:
        return []
    if "=" not in text:
        return [f"{m}={text}" for m in methods if m != VANILLA]
    out = []
    for part in text.split(","):
        method, _, folder = part.partition("=")
        if not method.strip() or not folder.strip():
            errors.append(f"drafter: expected DIR or method=DIR,method=DIR, got {part!r}")
            continue
        out.append(f"{method.strip()}={folder.strip()}")
    return out


def _note(warnings: list[str], missing: list[Missing] | None, warning: str, error: str,
          dataset: str | None = None) -> None:
    warnings.append(warning)
    if missing is not None:
        missing.append(Missing(warning, error, dataset))


def warn_missing(value: str, what: str, warnings: list[str], missing: list[Missing] | None = None) -> None:
    """A folder or file that is neither a placeholder, a built-in drafter, nor there yet."""
    if value and "{" not in value and value not in BUILTIN_DRAFTERS and not Path(value).expanduser().exists():
        _note(warnings, missing, f"{what} {value!r} does not exist yet (the job fails unless it is created first)",
              f"{what} {value!r}: no such file or folder (the job would fail at its start)")


def warn_dataset(value: str, split: str, workspace: Path | None, warnings: list[str],
                 missing: list[Missing] | None = None) -> None:
    """A prompt file or a prepared dataset's name, found as the job will look for it (`prompt_source`)."""
    if not value or "{" in value or workspace is None:
        return
    try:
        path = prompt_source(value, workspace, split)
    except PromptFileError as err:
        builtin = value.lower() if value.lower() in PREPARABLE else None
        error = (f"dataset {value}: not prepared in this workspace (the job would exit 2)" if builtin else
                 f"dataset {value}: neither a file nor a prepared dataset (the job would exit 2)")
        _note(warnings, missing, f"dataset {err}", error, builtin)
        return
    if not path.exists():
        _note(warnings, missing, f"dataset {value!r} does not exist yet (the job fails unless it is created first)",
              f"dataset {value!r}: no such file (the job would exit 2)")


def warn_target(value: str, warnings: list[str], missing: list[Missing] | None = None) -> None:
    """A target given as a path must be there; a hub id cannot be checked offline, a built-in name is known."""
    if value.startswith(("/", "./", "../", "~")) and not Path(value).expanduser().exists():
        _note(warnings, missing, f"target {value!r}: no such folder (a built-in name, a hub id or a model folder)",
              f"target {value!r}: no such folder (a built-in name, a hub id or a model folder)")
