"""Recipes: a run described as jobs in TOML, validated before anything starts.

A recipe has `[run]` (name, description, workspace), `[vars]` (substituted as `{vars.NAME}`),
`[gpus]` (roles -> GPU indices or "cpu", plus `share` and `exclusive`), optional `[slurm]`,
and jobs, written either as `[jobs.NAME]` tables or as `[[job]]` entries with a `name`.

Why hand-written checks rather than a schema library: every message must name the file, the
key path as the user wrote it (`jobs.pipeline.gpus`, `job[2].command`), the line, and the
expected type, and a recipe with many mistakes should list them all at once.

Placeholders in commands, env values, readiness checks and cwd: `{vars.NAME}`,
`{gpus.ROLE}` ("0,1" or "cpu"), `{nproc.ROLE}`, `{run_id}`, `{run_dir}`, `{workspace}`,
`{cache_dir}`, `{recipe_dir}`, `{python}`. Other braces are left alone.

Caching (see jobs/cache.py for the exact rule): a task that declares `outputs = [paths]` is
reused by a later run whose command, code version and inputs are the same, so its outputs
must live somewhere stable, `{cache_dir}` (default `<workspace>/cache/<run.name>`, or
`run.cache_dir`), never in `{run_dir}`. `run.code` lists the Python packages whose source counts
as the code version in that key (default ["adaflash"]). `inputs = [paths]` adds files it reads that no
earlier job makes; `cache = false` always runs it. `progress = {total = N, metric = "name"}`
tells the progress display how far the job is (the newest step of that metric in the runs
the job records; with `count = true`, how many times it was recorded); `summary = true` prints the job's output again when the run ends.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from jobs.assign import (
    CPU,
    DEFAULT_EXCLUSIVE,
    RESERVED_KEYS,
    Assignment,
    AssignmentError,
    Claim,
    check_conflicts,
    check_known,
    format_gpus,
    parse_gpus,
)

JOB_KINDS = ("task", "service")
RESTART_MODES = ("never", "on-failure")
ADAFLASH_MODULE = "adaflash.cli.main"
RECIPES_DIR = Path(__file__).resolve().parent.parent / "configs" / "recipes"

_TOP_KEYS = {"run", "vars", "gpus", "slurm", "jobs", "job"}
_RUN_KEYS = {"name": str, "description": str, "workspace": str, "cache_dir": str, "code": list}
DEFAULT_CODE = ["adaflash"]
_JOB_KEYS = {
    "name", "description", "command", "kind", "role", "gpus", "after", "ready", "restart", "max_restarts",
    "backoff", "backoff_max", "env", "torchrun", "cwd", "stop_grace", "node", "nodes",
    "outputs", "inputs", "cache", "progress", "summary",
}
_PROGRESS_KEYS = {"total", "metric", "count"}
_READY_KEYS = {"http", "log", "timeout", "interval"}
_TORCHRUN_KEYS = {"nproc", "args"}
_SLURM_KEYS = {
    "nodes": int, "gpus_per_node": int, "partition": str, "account": str, "time": str, "qos": str,
    "cpus_per_task": int, "mem": str, "job_name": str, "rdzv_port": int, "python": str,
    "sbatch": list, "setup": list,
}
_PLACEHOLDER = re.compile(r"\{(vars|gpus|nproc)\.([A-Za-z0-9_\-]+)\}|\{(run_id|run_dir|workspace|cache_dir|recipe_dir|python)\}")


# -- errors ------------------------------------------------------------------------------------


@dataclass
class Problem:
    key: str
    message: str
    line: int | None = None
    origin: str | None = None  # "--set k=v" when an override put the value there

    def render(self, path: str) -> str:
        where = f"{path}:{self.line}" if self.line else path
        origin = f" (from {self.origin})" if self.origin else ""
        return f"{where}: {self.key}: {self.message}{origin}" if self.key else f"{where}: {self.message}{origin}"


class RecipeError(ValueError):
    """A recipe that cannot run; `problems` lists each mistake with its key and line."""

    def __init__(self, path: str | os.PathLike, problems: list[Problem]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__("\n".join(p.render(self.path) for p in problems))


# -- locating keys in the TOML text --------------------------------------------------------------


def _strip_key(part: str) -> str:
    part = part.strip()
    if len(part) >= 2 and part[0] == part[-1] and part[0] in "\"'":
        return part[1:-1]
    return part


def _split_dotted(text: str) -> list[str]:
    parts, buf, quote = [], "", None
    for ch in text:
        if quote:
            buf += ch
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
            buf += ch
        elif ch == ".":
            parts.append(_strip_key(buf))
            buf = ""
        else:
            buf += ch
    parts.append(_strip_key(buf))
    return parts


def _bracket_delta(text: str) -> int:
    """Net [ / { nesting of a line, ignoring strings and comments."""
    depth, quote, i = 0, None, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        i += 1
    return depth


_KEY_LINE = re.compile(r"""^\s*((?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*'))*)\s*=(.*)$""")
_INLINE_KEY = re.compile(r"""[{,]\s*([A-Za-z0-9_\-]+|"[^"]*")\s*=""")


def key_lines(text: str) -> dict[str, int]:
    """Map every key path of a TOML text to its line (1-based); `[[job]]` entries are `job[i]`."""
    lines: dict[str, int] = {}
    prefix: list[str] = []
    array_counts: dict[str, int] = {}
    depth = 0
    in_multiline: str | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if in_multiline:
            if in_multiline in line:
                in_multiline = None
            continue
        if depth > 0:
            depth += _bracket_delta(line)
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith("[["):
            name = line[2:line.index("]]")] if "]]" in line else line[2:]
            parts = _split_dotted(name)
            base = ".".join(parts)
            index = array_counts.get(base, 0)
            array_counts[base] = index + 1
            prefix = parts[:-1] + [f"{parts[-1]}[{index}]"]
            lines.setdefault(".".join(prefix), number)
            continue
        if line.startswith("["):
            name = line[1:line.index("]")] if "]" in line else line[1:]
            prefix = _split_dotted(name)
            lines.setdefault(".".join(prefix), number)
            continue
        match = _KEY_LINE.match(line)
        if not match:
            continue
        path = prefix + _split_dotted(match.group(1))
        for i in range(len(prefix) + 1, len(path) + 1):
            lines.setdefault(".".join(path[:i]), number)
        value = match.group(2)
        for quote in ('"""', "'''"):
            if value.count(quote) == 1:
                in_multiline = quote
        if value.lstrip().startswith("{"):
            for inner in _INLINE_KEY.finditer(value):
                lines.setdefault(".".join(path + [_strip_key(inner.group(1))]), number)
        depth = max(0, _bracket_delta(value))
    return lines


# -- specs -------------------------------------------------------------------------------------


@dataclass
class ReadyCheck:
    """When a job counts as ready: HTTP GET answers 200, or a log line matches `log`."""

    http: str | None = None
    log: str | None = None
    timeout: float = 300.0
    interval: float = 0.5

    def describe(self) -> str:
        return f"http {self.http}" if self.http else f"log /{self.log}/"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RestartPolicy:
    mode: str = "never"
    max_restarts: int = 3
    backoff: float = 1.0
    backoff_max: float = 60.0

    def delay(self, restarts_done: int) -> float:
        """Exponential back-off: backoff, 2·backoff, 4·backoff, ... capped."""
        return min(self.backoff_max, self.backoff * (2 ** restarts_done))

    def allows(self, restarts_done: int) -> bool:
        return self.mode == "on-failure" and restarts_done < self.max_restarts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_head(argv: list[str], python: str | None = None) -> list[str]:
    """`adaflash ...` -> this interpreter's adaflash; `python ...` -> this interpreter."""
    python = python or sys.executable
    if not argv:
        return argv
    if argv[0] == "adaflash":
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
    if argv and argv[0] == "adaflash":
        return ["-m", ADAFLASH_MODULE, *argv[1:]]
    if argv and argv[0] in ("python", "python3", sys.executable):
        rest = argv[1:]
        if rest and rest[0] == "-m":
            return ["-m", *rest[1:]]
        if rest and not rest[0].startswith("-"):
            return rest  # a script
        return ["--no-python", python or sys.executable, *rest]  # python -c ... and other flags
    return ["--no-python", *argv]


@dataclass
class JobSpec:
    """One job of a recipe, placeholders already substituted."""

    name: str
    command: list[str]
    kind: str = "task"
    role: str | None = None
    gpu_roles: dict[str, list[int] | None] = field(default_factory=dict)  # role -> GPUs claimed
    launcher: bool = False  # gpus span several roles: the command places its own workers
    after: list[str] = field(default_factory=list)
    ready: ReadyCheck | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    env: dict[str, str] = field(default_factory=dict)
    torchrun_nproc: int | None = None
    torchrun_args: list[str] = field(default_factory=list)
    cwd: str | None = None
    stop_grace: float = 10.0
    node: int = 0
    nodes: int | None = None
    description: str | None = None
    outputs: list[str] = field(default_factory=list)  # what a cached task leaves behind (files or folders)
    inputs: list[str] = field(default_factory=list)  # files it reads that no earlier job produces
    cache: bool = True
    progress_total: float | None = None
    progress_metric: str | None = None
    progress_count: bool = False  # progress = how many times the metric was reported (e.g. one per benchmark cell)
    summary: bool = False  # print its output again at the end of the run

    @property
    def cacheable(self) -> bool:
        """A task with declared outputs: a later run with the same key reuses them instead of running it."""
        return self.kind == "task" and bool(self.outputs) and self.cache

    @property
    def gpus(self) -> tuple[int, ...] | None:
        """Every GPU of the job, sorted; None when it runs on CPU."""
        indices = sorted({i for g in self.gpu_roles.values() for i in (g or [])})
        return tuple(indices) if indices else None

    @property
    def gpus_label(self) -> str:
        return format_gpus(self.gpus)

    @property
    def cuda_visible_devices(self) -> str | None:
        """CUDA_VISIBLE_DEVICES for the job; None for a launcher (it sets its workers' own)."""
        if self.launcher:
            return None
        return "" if self.gpus is None else ",".join(str(i) for i in self.gpus)

    def argv(self, python: str | None = None) -> list[str]:
        """The exact argv started locally (torchrun wrapped, `adaflash` resolved)."""
        if self.torchrun_nproc is None:
            return resolve_head(self.command, python)
        return [*torchrun_launcher(python), "--standalone", "--nproc_per_node", str(self.torchrun_nproc),
                *self.torchrun_args, *torchrun_tail(self.command, python)]

    def claims(self) -> list[Claim]:
        return [Claim(role, i, self.name) for role, g in self.gpu_roles.items() for i in (g or [])]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ready"] = self.ready.to_dict() if self.ready else None
        out["restart"] = self.restart.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        data = dict(data)
        data["ready"] = ReadyCheck(**data["ready"]) if data.get("ready") else None
        data["restart"] = RestartPolicy(**data.get("restart") or {})
        return cls(**data)


@dataclass
class SlurmSpec:
    nodes: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    job_name: str | None = None
    rdzv_port: int = 29500
    python: str | None = None
    sbatch: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Recipe:
    path: str
    name: str
    description: str | None
    workspace: str | None
    vars: dict[str, str]
    assignment: Assignment
    jobs: dict[str, JobSpec]
    slurm: SlurmSpec | None = None
    overrides: list[str] = field(default_factory=list)
    context: dict[str, str] = field(default_factory=dict)
    cache_dir: str | None = None  # `run.cache_dir` as written; the folder in use is context["cache_dir"]
    code: list[str] = field(default_factory=lambda: list(DEFAULT_CODE))  # packages in the cache key

    def order(self) -> list[str]:
        """Jobs in a start order that respects `after` (recipe order among equals)."""
        return topo_order({n: j.after for n, j in self.jobs.items()})

    def ancestors(self) -> dict[str, set[str]]:
        return ancestors_of({n: j.after for n, j in self.jobs.items()})

    def may_overlap(self, a: str | None, b: str | None) -> bool:
        """Whether two jobs can be alive at once (a service lives until the run ends)."""
        if a is None or b is None or a == b:
            return True
        anc = self.ancestors()
        if a in anc.get(b, ()):
            return self.jobs[a].kind == "service"
        if b in anc.get(a, ()):
            return self.jobs[b].kind == "service"
        return True

    def gpus_in_use(self) -> set[int]:
        return {i for j in self.jobs.values() for i in (j.gpus or ())}

    def claims(self) -> list[Claim]:
        return [c for j in self.jobs.values() for c in j.claims()]

    def gpu_errors(self, known: Any = None) -> list[str]:
        """Unknown GPUs and conflicts between jobs that may run at once (None: skip the index check)."""
        errors = check_known(self.assignment.claims(), known)
        role_gpus = {r: set(g.gpus or ()) for r, g in self.assignment.roles.items()}
        errors += check_known([c for c in self.claims() if c.gpu not in role_gpus.get(c.role, set())], known)
        errors += check_conflicts(self.claims(), self.assignment.can_share, self.may_overlap,
                                  exclusive=self.assignment.exclusive)
        return errors

    def check_gpus(self, known: Any = None) -> None:
        errors = self.gpu_errors(known)
        if errors:
            raise AssignmentError(errors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "name": self.name, "description": self.description, "workspace": self.workspace,
            "vars": dict(self.vars),
            "gpus": {**{r: (CPU if g.gpus is None else list(g.gpus)) for r, g in self.assignment.roles.items()},
                     "share": self.assignment.share, "exclusive": sorted(self.assignment.exclusive)},
            "jobs": {n: j.to_dict() for n, j in self.jobs.items()},
            "slurm": self.slurm.to_dict() if self.slurm else None,
            "overrides": list(self.overrides), "context": dict(self.context), "cache_dir": self.cache_dir,
            "code": list(self.code),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        """Rebuild a resolved recipe (the run log's runs.config) without re-validating it."""
        return cls(
            path=data["path"], name=data["name"], description=data.get("description"),
            workspace=data.get("workspace"), vars=dict(data.get("vars") or {}),
            assignment=Assignment.from_mapping(data.get("gpus") or {}),
            jobs={n: JobSpec.from_dict(j) for n, j in (data.get("jobs") or {}).items()},
            slurm=SlurmSpec(**data["slurm"]) if data.get("slurm") else None,
            overrides=list(data.get("overrides") or []), context=dict(data.get("context") or {}),
            cache_dir=data.get("cache_dir"), code=list(data.get("code", DEFAULT_CODE)),
        )


# -- graph helpers -------------------------------------------------------------------------------


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


# -- overrides -------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """`key.path=value`: the value as a TOML literal (`[0,1]`, `true`, `3`), else a plain string."""
    if "=" not in text:
        raise ValueError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ValueError(f"--set {text!r}: expected key.path=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, str]:
    """Set each `key.path=value` in `data`; returns key path -> the --set text that set it."""
    origins: dict[str, str] = {}
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"--set {text}: {'.'.join(parts[:i + 1])} is not a table")
            node = child
        node[parts[-1]] = value
        origins[".".join(parts)] = f"--set {text}"
    return origins


# -- validation ------------------------------------------------------------------------------------


def _nearest(table: Mapping[str, Any], key: str) -> Any:
    """The entry of `key` or of its closest dotted prefix (a.b.c, then a.b, then a); None if none."""
    parts = key.split(".")
    while parts:
        found = table.get(".".join(parts))
        if found:
            return found
        parts.pop()
    return None


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


class _Checker:
    def __init__(self, lines: dict[str, int], origins: dict[str, str]) -> None:
        self.lines = lines
        self.origins = origins
        self.problems: list[Problem] = []
        self.aliases: dict[str, str] = {}  # normalized prefix (jobs.NAME) -> written prefix (job[2])

    def shown(self, key: str) -> str:
        for norm, written in self.aliases.items():
            if key == norm or key.startswith(norm + "."):
                return written + key[len(norm):]
        return key

    def line_of(self, key: str) -> int | None:
        return _nearest(self.lines, self.shown(key))

    def origin_of(self, key: str) -> str | None:
        return _nearest(self.origins, key)

    def add(self, key: str, message: str) -> None:
        origin = self.origin_of(key)
        self.problems.append(Problem(self.shown(key), message, None if origin else self.line_of(key), origin))

    def unknown_keys(self, table: Mapping[str, Any], allowed: Iterable[str], key: str) -> None:
        allowed = set(allowed)
        for name in table:
            if name not in allowed:
                where = f"{key}.{name}" if key else name
                self.add(where, f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def typed(self, table: Mapping[str, Any], name: str, key: str, kinds: tuple[type, ...], expected: str,
              *, required: bool = False) -> Any:
        full = f"{key}.{name}" if key else name
        if name not in table:
            if required:
                self.add(full, f"required key missing (expected {expected})")
            return None
        value = table[name]
        if isinstance(value, bool) and bool not in kinds:
            self.add(full, f"expected {expected}, got {value!r} ({_type_name(value)})")
            return None
        if not isinstance(value, kinds):
            self.add(full, f"expected {expected}, got {value!r} ({_type_name(value)})")
            return None
        return value

    def table(self, data: Mapping[str, Any], name: str, *, required: bool = False) -> dict[str, Any]:
        value = self.typed(data, name, "", (dict,), "a table", required=required)
        return value or {}


def _scalar_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return None


class _Substituter:
    def __init__(self, chk: _Checker, values: dict[str, dict[str, str]], builtins: dict[str, str]) -> None:
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

        return _PLACEHOLDER.sub(repl, text)


def _resolve_vars(raw: dict[str, str], chk: _Checker, builtins: dict[str, str],
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
            new = _PLACEHOLDER.sub(lambda m, name=name: lookup(m, name), text)
            if new != text:
                resolved[name], changed = new, True
        if not changed:
            break
    for name, text in resolved.items():
        for match in _PLACEHOLDER.finditer(text):
            chk.add(f"vars.{name}", f"unresolvable placeholder {match.group(0)} (unknown or circular)")
    return resolved


def _check_job(
    chk: _Checker, name: str, table: dict[str, Any], key: str, assignment: Assignment | None,
    sub: _Substituter, builtins: Mapping[str, str],
) -> JobSpec | None:
    chk.unknown_keys(table, _JOB_KEYS, key)
    n_problems = len(chk.problems)
    command = chk.typed(table, "command", key, (list,), "a list of strings (argv, never a shell string)",
                        required=True)
    if command is not None:
        if not command:
            chk.add(f"{key}.command", "expected a non-empty list of strings (argv)")
        for i, item in enumerate(command):
            if not isinstance(item, str):
                chk.add(f"{key}.command", f"item {i}: expected a string, got {item!r} ({_type_name(item)})")
    kind = chk.typed(table, "kind", key, (str,), f"one of {', '.join(JOB_KINDS)}") or "task"
    if kind not in JOB_KINDS:
        chk.add(f"{key}.kind", f"expected one of {', '.join(JOB_KINDS)}, got {kind!r}")
    role = chk.typed(table, "role", key, (str,), "a role name (string)")
    after = chk.typed(table, "after", key, (list,), "a list of job names") or []
    for item in after:
        if not isinstance(item, str):
            chk.add(f"{key}.after", f"expected job names (strings), got {item!r} ({_type_name(item)})")
    after = [a for a in after if isinstance(a, str)]

    # GPUs: a role name, several role names, "cpu", or explicit indices.
    gpu_roles: dict[str, list[int] | None] = {}
    launcher = False
    roles = assignment.roles if assignment else {}
    if "gpus" in table:
        value = table["gpus"]
        role_names = None
        if isinstance(value, str) and value in roles:
            role_names = [value]
        elif isinstance(value, list) and value and all(isinstance(v, str) and v.lower() != CPU for v in value) \
                and not all(v.isdigit() for v in value):
            unknown = [v for v in value if v not in roles]
            if unknown:
                chk.add(f"{key}.gpus", f"unknown role(s) {', '.join(map(repr, unknown))} "
                                       f"(roles in [gpus]: {', '.join(roles) or 'none'})")
            role_names = [v for v in value if v in roles]
            launcher = len(role_names) > 1
        if role_names is not None:
            for r in role_names:
                gpus = roles[r].gpus
                gpu_roles[r] = None if gpus is None else list(gpus)
        else:
            try:
                gpus = parse_gpus(value, owner="value")
                gpu_roles[role or f"job:{name}"] = None if gpus is None else list(gpus)
            except ValueError as err:
                expected = ("expected a role name, a list of role names, \"cpu\", a GPU index or a list of "
                            "GPU indices")
                if isinstance(value, bool) or not isinstance(value, (str, int, list)):
                    chk.add(f"{key}.gpus", f"{expected}, got {value!r} ({_type_name(value)})")
                else:
                    hint = f" (roles in [gpus]: {', '.join(roles) or 'none'})" if isinstance(value, str) else ""
                    chk.add(f"{key}.gpus", f"{str(err).removeprefix('value: ')}{hint}")
    elif role is not None:
        if role in roles:
            gpus = roles[role].gpus
            gpu_roles[role] = None if gpus is None else list(gpus)
        elif assignment is not None:
            chk.add(f"{key}.role", f"role {role!r} has no GPUs in [gpus]: add `{role} = [...]` or "
                                   f"`{role} = \"cpu\"` there, or give the job `gpus`")
    # readiness
    ready = None
    ready_table = chk.typed(table, "ready", key, (dict,), "a table like {http = \"http://127.0.0.1:PORT/health\"} "
                                                          "or {log = \"regex\"}")
    if ready_table is not None:
        rkey = f"{key}.ready"
        chk.unknown_keys(ready_table, _READY_KEYS, rkey)
        http = chk.typed(ready_table, "http", rkey, (str,), "a URL string")
        log = chk.typed(ready_table, "log", rkey, (str,), "a regular expression string")
        timeout = chk.typed(ready_table, "timeout", rkey, (int, float), "a number of seconds")
        interval = chk.typed(ready_table, "interval", rkey, (int, float), "a number of seconds")
        if (http is None) == (log is None):
            chk.add(rkey, "expected exactly one of http = \"URL\" or log = \"regex\"")
        if log is not None:
            try:
                re.compile(log)
            except re.error as err:
                chk.add(f"{rkey}.log", f"invalid regular expression: {err}")
        if http is not None and not re.match(r"^https?://", http):
            chk.add(f"{rkey}.http", f"expected an http:// URL, got {http!r}")
        for pname, pval in (("timeout", timeout), ("interval", interval)):
            if pval is not None and pval <= 0:
                chk.add(f"{rkey}.{pname}", f"expected a positive number of seconds, got {pval!r}")
        ready = ReadyCheck(http=sub(http, f"{rkey}.http") if http else None, log=log,
                           timeout=float(timeout or 300.0), interval=float(interval or 0.5))
    # restart
    mode = chk.typed(table, "restart", key, (str,), f"one of {', '.join(RESTART_MODES)}") or "never"
    if mode not in RESTART_MODES:
        chk.add(f"{key}.restart", f"expected one of {', '.join(RESTART_MODES)}, got {mode!r}")
    max_restarts = chk.typed(table, "max_restarts", key, (int,), "an integer >= 0")
    if max_restarts is not None and max_restarts < 0:
        chk.add(f"{key}.max_restarts", f"expected an integer >= 0, got {max_restarts}")
    backoff = chk.typed(table, "backoff", key, (int, float), "a number of seconds")
    backoff_max = chk.typed(table, "backoff_max", key, (int, float), "a number of seconds")
    for pname, pval in (("backoff", backoff), ("backoff_max", backoff_max)):
        if pval is not None and pval < 0:
            chk.add(f"{key}.{pname}", f"expected a number of seconds >= 0, got {pval!r}")
    policy = RestartPolicy(mode=mode, max_restarts=3 if max_restarts is None else max_restarts,
                           backoff=1.0 if backoff is None else float(backoff),
                           backoff_max=60.0 if backoff_max is None else float(backoff_max))
    # env
    env: dict[str, str] = {}
    env_table = chk.typed(table, "env", key, (dict,), "a table of NAME = \"value\"") or {}
    for ename, evalue in env_table.items():
        text = _scalar_text(evalue)
        if text is None:
            chk.add(f"{key}.env.{ename}", f"expected a string, number or boolean, got {_type_name(evalue)}")
        else:
            env[ename] = sub(text, f"{key}.env.{ename}")
    # torchrun
    nproc, tr_args = None, []
    tr = chk.typed(table, "torchrun", key, (dict,), "a table like {nproc = 2} or {nproc = \"auto\"}")
    if tr is not None:
        chk.unknown_keys(tr, _TORCHRUN_KEYS, f"{key}.torchrun")
        raw = tr.get("nproc", "auto")
        n_gpus = sum(len(g or []) for g in gpu_roles.values())
        if raw == "auto":
            nproc = max(1, n_gpus)
        elif isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
            nproc = raw
            if n_gpus and raw > n_gpus:
                chk.add(f"{key}.torchrun.nproc", f"{raw} processes but the job has {n_gpus} GPU(s)")
        else:
            chk.add(f"{key}.torchrun.nproc", f"expected an integer >= 1 or \"auto\", got {raw!r}")
        tr_args = tr.get("args", [])
        if not isinstance(tr_args, list) or not all(isinstance(a, str) for a in tr_args):
            chk.add(f"{key}.torchrun.args", "expected a list of strings")
            tr_args = []
    if command is not None:
        command = [sub(c, f"{key}.command") if isinstance(c, str) else c for c in command]
    cwd = chk.typed(table, "cwd", key, (str,), "a folder path string")
    stop_grace = chk.typed(table, "stop_grace", key, (int, float), "a number of seconds")
    node = chk.typed(table, "node", key, (int,), "a node index (integer >= 0)")
    nodes = chk.typed(table, "nodes", key, (int,), "a number of nodes (integer >= 1)")
    description = chk.typed(table, "description", key, (str,), "a string")
    outputs, inputs, cache, total, metric, count, summary = _check_cache_keys(chk, table, key, kind, command, sub,
                                                                              builtins)
    if len(chk.problems) > n_problems:
        return None
    return JobSpec(
        name=name, command=list(command), kind=kind, role=role,
        gpu_roles=gpu_roles, launcher=launcher, after=list(after), ready=ready, restart=policy, env=env,
        torchrun_nproc=nproc, torchrun_args=list(tr_args), cwd=sub(cwd, f"{key}.cwd") if cwd else None,
        stop_grace=float(10.0 if stop_grace is None else stop_grace), node=node or 0, nodes=nodes,
        description=description, outputs=outputs, inputs=inputs, cache=cache, progress_total=total,
        progress_metric=metric, progress_count=count, summary=summary,
    )


def _paths(chk: _Checker, table: dict[str, Any], name: str, key: str, sub: _Substituter) -> list[str]:
    value = chk.typed(table, name, key, (list,), "a list of file or folder paths") or []
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            chk.add(f"{key}.{name}", f"item {i}: expected a path string, got {item!r} ({_type_name(item)})")
        else:
            out.append(sub(item, f"{key}.{name}"))
    return out


def _check_cache_keys(
    chk: _Checker, table: dict[str, Any], key: str, kind: str, command: list[Any] | None, sub: _Substituter,
    builtins: Mapping[str, str],
) -> tuple[list[str], list[str], bool, float | None, str | None, bool, bool]:
    """outputs / inputs / cache / progress / summary of one job."""
    outputs = _paths(chk, table, "outputs", key, sub)
    inputs = _paths(chk, table, "inputs", key, sub)
    cache = chk.typed(table, "cache", key, (bool,), "true or false")
    summary = chk.typed(table, "summary", key, (bool,), "true or false")
    if outputs and kind != "task":
        chk.add(f"{key}.outputs", "only a task (kind = \"task\") can have outputs: a service never finishes, "
                                  "so it is never reused")
    if outputs and cache is not False and command:
        # A reused job must mean the same thing in every run: run-specific paths change its key each time.
        per_run = [v for v in (builtins.get("run_id"), builtins.get("run_dir")) if v]
        texts = [c for c in command if isinstance(c, str)] + outputs  # command: already substituted
        if any(marker in text for text in texts for marker in per_run):
            chk.add(f"{key}.outputs", "a job with outputs is reused across runs, so neither its command nor its "
                                      "outputs may use {run_dir} or {run_id} (put them under {cache_dir}), "
                                      "or set cache = false")
    total, metric = None, None
    progress = chk.typed(table, "progress", key, (dict,), "a table like {total = 60, metric = \"loss\"}")
    if progress is not None:
        pkey = f"{key}.progress"
        chk.unknown_keys(progress, _PROGRESS_KEYS, pkey)
        raw_total = progress.get("total")
        if raw_total is not None:
            text = sub(raw_total, f"{pkey}.total") if isinstance(raw_total, str) else raw_total
            try:
                total = float(text)
                if isinstance(text, bool) or total <= 0:
                    raise ValueError
            except (TypeError, ValueError):
                chk.add(f"{pkey}.total", f"expected a positive number (or a {{vars.NAME}} that is one), got {text!r}")
                total = None
        metric = chk.typed(progress, "metric", pkey, (str,), "a metric name (string)")
        count = chk.typed(progress, "count", pkey, (bool,), "true or false")
        if count and not metric:
            chk.add(f"{pkey}.count", "count = true counts the reports of a metric: give `metric` too")
    return outputs, inputs, cache is not False, total, metric, bool(progress and progress.get("count") is True), \
        bool(summary)


def _check_slurm(chk: _Checker, table: dict[str, Any]) -> SlurmSpec | None:
    chk.unknown_keys(table, _SLURM_KEYS, "slurm")
    values: dict[str, Any] = {}
    n_problems = len(chk.problems)
    for name, kind in _SLURM_KEYS.items():
        expected = {int: "an integer", str: "a string", list: "a list of strings"}[kind]
        value = chk.typed(table, name, "slurm", (kind,), expected)
        if value is None:
            continue
        if kind is list and not all(isinstance(v, str) for v in value):
            chk.add(f"slurm.{name}", "expected a list of strings")
            continue
        if kind is int and value < (0 if name == "gpus_per_node" else 1):
            chk.add(f"slurm.{name}", f"expected a positive integer, got {value}")
            continue
        values[name] = value
    if len(chk.problems) > n_problems:
        return None
    return SlurmSpec(**values)


def parse_recipe(
    text: str,
    path: str | os.PathLike = "<recipe>",
    overrides: Iterable[str] = (),
    *,
    context: Mapping[str, str] | None = None,
) -> Recipe:
    """Validate a recipe's TOML text; RecipeError lists every problem with key and line.

    `context` gives run_id, run_dir and workspace (placeholders shown as <run_dir> etc. when absent).
    """
    path = str(path)
    overrides = list(overrides)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        line = getattr(err, "lineno", None)
        if line is None:
            found = re.search(r"line (\d+)", str(err))
            line = int(found.group(1)) if found else None
        raise RecipeError(path, [Problem("", f"invalid TOML: {err}", line)]) from None
    lines = key_lines(text)
    chk = _Checker(lines, {})

    # [[job]] entries become jobs.NAME so that overrides and checks see one shape.
    jobs_raw: dict[str, Any] = {}
    if "jobs" in data:
        if isinstance(data["jobs"], dict):
            jobs_raw.update(data["jobs"])
        else:
            chk.add("jobs", f"expected a table of [jobs.NAME] tables, got {_type_name(data['jobs'])}")
    if "job" in data:
        entries = data.pop("job")
        if not isinstance(entries, list):
            chk.add("job", "expected [[job]] entries (an array of tables)")
            entries = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                chk.add(f"job[{i}]", "expected a table")
                continue
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                chk.add(f"job[{i}].name", "required key missing (expected the job's name, a string)")
                continue
            if name in jobs_raw:
                chk.add(f"job[{i}].name", f"duplicate job name {name!r}")
                continue
            jobs_raw[name] = {k: v for k, v in entry.items() if k != "name"}
            chk.aliases[f"jobs.{name}"] = f"job[{i}]"
    data["jobs"] = jobs_raw
    try:
        chk.origins = apply_overrides(data, overrides)
    except ValueError as err:
        raise RecipeError(path, [Problem("", str(err))]) from None

    chk.unknown_keys(data, _TOP_KEYS, "")
    run = chk.table(data, "run", required=True)
    chk.unknown_keys(run, _RUN_KEYS, "run")
    name = chk.typed(run, "name", "run", (str,), "a string", required=True)
    if isinstance(name, str) and not re.match(r"^[A-Za-z0-9_.\-]+$", name):
        chk.add("run.name", f"expected letters, digits, '.', '_' or '-', got {name!r}")
    description = chk.typed(run, "description", "run", (str,), "a string")
    workspace = chk.typed(run, "workspace", "run", (str,), "a folder path string")
    cache_dir = chk.typed(run, "cache_dir", "run", (str,), "a folder path string (relative: inside the workspace)")
    code = chk.typed(run, "code", "run", (list,), "a list of Python package names")
    if code is not None and not all(isinstance(c, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_.]*$", c) for c in code):
        chk.add("run.code", f"expected a list of Python package names, got {code!r}")

    raw_vars: dict[str, str] = {}
    for vname, vvalue in chk.table(data, "vars").items():
        text_value = _scalar_text(vvalue)
        if text_value is None:
            chk.add(f"vars.{vname}", f"expected a string, number or boolean, got {_type_name(vvalue)}")
        else:
            raw_vars[vname] = text_value

    gpus_table = chk.table(data, "gpus")
    assignment: Assignment | None = None
    try:
        assignment = Assignment.from_mapping(gpus_table)
    except AssignmentError:
        # Re-check key by key so each message carries its own line.
        for role, value in gpus_table.items():
            if role == "share":
                if not isinstance(value, bool):
                    chk.add("gpus.share", f"expected true or false, got {value!r} ({_type_name(value)})")
            elif role == "exclusive":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    chk.add("gpus.exclusive", f"expected a list of role names, got {value!r}")
            else:
                try:
                    parse_gpus(value, owner=f"role {role!r}")
                except ValueError as err:
                    chk.add(f"gpus.{role}", str(err))
    slurm = _check_slurm(chk, data["slurm"]) if isinstance(data.get("slurm"), dict) else None
    if "slurm" in data and not isinstance(data["slurm"], dict):
        chk.add("slurm", f"expected a table, got {_type_name(data['slurm'])}")

    ctx = dict(context or {})
    recipe_dir = str(Path(path).resolve().parent) if not path.startswith("<") else os.getcwd()
    builtins = {
        "run_id": ctx.get("run_id", "<run_id>"), "run_dir": ctx.get("run_dir", "<run_dir>"),
        "workspace": ctx.get("workspace", "<workspace>"), "cache_dir": ctx.get("cache_dir", "<cache_dir>"),
        "recipe_dir": recipe_dir, "python": sys.executable,
    }
    gpu_values = {
        "gpus": {r: format_gpus(g.gpus) for r, g in (assignment.roles.items() if assignment else [])},
        "nproc": {r: str(g.nproc) for r, g in (assignment.roles.items() if assignment else [])},
    }
    variables = _resolve_vars(raw_vars, chk, builtins, gpu_values)
    sub = _Substituter(chk, {"vars": variables, **gpu_values}, builtins)

    if not jobs_raw:
        chk.add("jobs", "the recipe has no jobs: add [jobs.NAME] tables or [[job]] entries")
    jobs: dict[str, JobSpec] = {}
    for jname, jtable in jobs_raw.items():
        key = f"jobs.{jname}"
        if not re.match(r"^[A-Za-z0-9_\-]+$", jname):
            chk.add(key, "job names use letters, digits, '_' and '-' (they name log files)")
            continue
        if not isinstance(jtable, dict):
            chk.add(key, f"expected a table, got {_type_name(jtable)}")
            continue
        spec = _check_job(chk, jname, jtable, key, assignment, sub, builtins)
        if spec is not None:
            jobs[jname] = spec
    # The dependency graph (from the raw tables, so it is checked even when a job has other mistakes).
    graph = {
        n: [d for d in t.get("after", []) if isinstance(d, str)] if isinstance(t, dict) and isinstance(
            t.get("after", []), list) else []
        for n, t in jobs_raw.items()
    }
    for jname, deps in graph.items():
        for dep in deps:
            if dep == jname:
                chk.add(f"jobs.{jname}.after", "a job cannot wait for itself")
            elif dep not in jobs_raw:
                chk.add(f"jobs.{jname}.after", f"unknown job {dep!r} (jobs: {', '.join(jobs_raw)})")
    cycle = find_cycle({n: [d for d in deps if d != n] for n, deps in graph.items()})
    if cycle:
        chk.add(f"jobs.{cycle[0]}.after", f"dependency cycle: {' -> '.join(cycle)}")

    if chk.problems or assignment is None or not isinstance(name, str):
        raise RecipeError(path, chk.problems or [Problem("", "invalid recipe")])
    recipe = Recipe(
        path=path, name=name, description=description, workspace=workspace, vars=variables,
        assignment=assignment, jobs=jobs, slurm=slurm, overrides=overrides, context=ctx, cache_dir=cache_dir,
        code=list(DEFAULT_CODE if code is None else code),
    )
    # Conflicts need the whole graph (jobs that never overlap may share a GPU).
    conflicts = check_conflicts(recipe.claims(), assignment.can_share, recipe.may_overlap,
                                exclusive=assignment.exclusive)
    if conflicts:
        raise RecipeError(path, [Problem("gpus", msg, chk.line_of("gpus")) for msg in conflicts])
    return recipe


def load_recipe(
    path: str | os.PathLike, overrides: Iterable[str] = (), *, context: Mapping[str, str] | None = None
) -> Recipe:
    """Read and validate a recipe file (a bare name looks in configs/recipes/)."""
    file = find_recipe(path)
    try:
        text = file.read_text()
    except OSError as err:
        raise RecipeError(str(path), [Problem("", f"cannot read the recipe: {err.strerror or err}")]) from None
    return parse_recipe(text, str(file), overrides, context=context)


def find_recipe(path: str | os.PathLike) -> Path:
    """A path as given, else a shipped recipe by name (`smollm2-cpu` -> configs/recipes/smollm2-cpu.toml)."""
    candidate = Path(path)
    if candidate.exists():
        return candidate
    for shipped in (RECIPES_DIR / f"{path}.toml", RECIPES_DIR / str(path)):
        if shipped.exists():
            return shipped
    return candidate


def shipped_recipes() -> list[Path]:
    return sorted(RECIPES_DIR.glob("*.toml"))


__all__ = [
    "DEFAULT_EXCLUSIVE", "RESERVED_KEYS", "JobSpec", "ReadyCheck", "Recipe", "RecipeError", "RestartPolicy",
    "SlurmSpec", "apply_overrides", "find_recipe", "key_lines", "load_recipe", "parse_override", "parse_recipe",
    "shipped_recipes",
]
