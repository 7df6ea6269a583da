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
the job records; with `count = true`, how many times it was recorded); `summary = true` prints
the job's output again when the run ends.

Where the pieces live: jobs.recipe_spec (what a validated recipe is), jobs.recipe_checker (how
mistakes are collected), jobs.recipe_jobs (one job's checks), jobs.placeholders, jobs.overrides
(`--set`), jobs.toml_lines (the line of each key) and jobs.dag (the `after` graph).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from jobs.assign import Assignment, AssignmentError, check_conflicts, format_gpus, parse_gpus
from jobs.dag import find_cycle
from jobs.overrides import apply_overrides
from jobs.placeholders import Substituter, resolve_vars
from jobs.recipe_checker import Checker, Problem, scalar_text, type_name
from jobs.recipe_jobs import check_job
from jobs.recipe_spec import DEFAULT_CODE, JobSpec, Recipe, SlurmSpec
from jobs.toml_lines import key_lines

RECIPES_DIR = Path(__file__).resolve().parent.parent / "configs" / "recipes"

_TOP_KEYS = {"run", "vars", "gpus", "slurm", "jobs", "job"}
_RUN_KEYS = {"name": str, "description": str, "workspace": str, "cache_dir": str, "code": list}
_SLURM_KEYS = {
    "nodes": int, "gpus_per_node": int, "partition": str, "account": str, "time": str, "qos": str,
    "cpus_per_task": int, "mem": str, "job_name": str, "rdzv_port": int, "python": str,
    "sbatch": list, "setup": list,
}


class RecipeError(ValueError):
    """A recipe that cannot run; `problems` lists each mistake with its key and line."""

    def __init__(self, path: str | os.PathLike, problems: list[Problem]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__("\n".join(p.render(self.path) for p in problems))


# -- parsing ------------------------------------------------------------------------------------------


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
    data = _load_toml(text, path)
    chk = Checker(key_lines(text), {})
    jobs_raw = _gather_jobs(chk, data)
    try:
        chk.origins = apply_overrides(data, overrides)
    except ValueError as err:
        raise RecipeError(path, [Problem("", str(err))]) from None

    chk.unknown_keys(data, _TOP_KEYS, "")
    run = _check_run(chk, data)
    raw_vars = _check_vars(chk, data)
    assignment = _check_gpus(chk, data)
    slurm = _check_slurm(chk, data)

    ctx = dict(context or {})
    builtins = _builtins(path, ctx)
    gpu_values = _gpu_values(assignment)
    variables = resolve_vars(raw_vars, chk, builtins, gpu_values)
    sub = Substituter(chk, {"vars": variables, **gpu_values}, builtins)
    jobs = _check_jobs(chk, jobs_raw, assignment, sub, builtins)
    _check_graph(chk, jobs_raw)

    if chk.problems or assignment is None or not isinstance(run.name, str):
        raise RecipeError(path, chk.problems or [Problem("", "invalid recipe")])
    recipe = Recipe(
        path=path, name=run.name, description=run.description, workspace=run.workspace, vars=variables,
        assignment=assignment, jobs=jobs, slurm=slurm, overrides=overrides, context=ctx,
        cache_dir=run.cache_dir,
        code=list(DEFAULT_CODE if run.code is None else run.code),
    )
    # Conflicts need the whole graph (jobs that never overlap may share a GPU).
    conflicts = check_conflicts(recipe.claims(), assignment.can_share, recipe.may_overlap,
                                exclusive=assignment.exclusive)
    if conflicts:
        raise RecipeError(path, [Problem("gpus", msg, chk.line_of("gpus")) for msg in conflicts])
    return recipe


def _load_toml(text: str, path: str) -> dict[str, Any]:
    """The parsed TOML; invalid TOML is one RecipeError with the line tomllib names."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        line = getattr(err, "lineno", None)
        if line is None:
            found = re.search(r"line (\d+)", str(err))
            line = int(found.group(1)) if found else None
        raise RecipeError(path, [Problem("", f"invalid TOML: {err}", line)]) from None


def _gather_jobs(chk: Checker, data: dict[str, Any]) -> dict[str, Any]:
    """[[job]] entries become jobs.NAME so that overrides and checks see one shape.

    Returns the job tables by name (also put in `data["jobs"]`); `chk` learns to show a
    `[[job]]` entry's keys as written (`job[2].command`).
    """
    jobs_raw: dict[str, Any] = {}
    if "jobs" in data:
        if isinstance(data["jobs"], dict):
            jobs_raw.update(data["jobs"])
        else:
            chk.add("jobs", f"expected a table of [jobs.NAME] tables, got {type_name(data['jobs'])}")
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
    return jobs_raw


class _RunSettings(NamedTuple):
    """`[run]` as checked: each value None when absent or wrong."""

    name: str | None
    description: str | None
    workspace: str | None
    cache_dir: str | None
    code: list[str] | None


def _check_run(chk: Checker, data: dict[str, Any]) -> _RunSettings:
    run = chk.table(data, "run", required=True)
    chk.unknown_keys(run, _RUN_KEYS, "run")
    name = chk.typed(run, "name", "run", (str,), "a string", required=True)
    if isinstance(name, str) and not re.match(r"^[A-Za-z0-9_.\-]+$", name):
        chk.add("run.name", f"expected letters, digits, '.', '_' or '-', got {name!r}")
    description = chk.typed(run, "description", "run", (str,), "a string")
    workspace = chk.typed(run, "workspace", "run", (str,), "a folder path string")
    cache_dir = chk.typed(run, "cache_dir", "run", (str,),
                          "a folder path string (relative: inside the workspace)")
    code = chk.typed(run, "code", "run", (list,), "a list of Python package names")
    package = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
    if code is not None and not all(isinstance(c, str) and package.match(c) for c in code):
        chk.add("run.code", f"expected a list of Python package names, got {code!r}")
    return _RunSettings(name, description, workspace, cache_dir, code)


def _check_vars(chk: Checker, data: dict[str, Any]) -> dict[str, str]:
    """`[vars]` as text, placeholders not yet resolved."""
    raw_vars: dict[str, str] = {}
    for vname, vvalue in chk.table(data, "vars").items():
        text_value = scalar_text(vvalue)
        if text_value is None:
            chk.add(f"vars.{vname}", f"expected a string, number or boolean, got {type_name(vvalue)}")
        else:
            raw_vars[vname] = text_value
    return raw_vars


def _check_gpus(chk: Checker, data: dict[str, Any]) -> Assignment | None:
    """`[gpus]` as an Assignment. When it is not valid, a problem per bad key, and the roles that did
    parse (so the jobs' checks do not also report every role as unknown); None when none did."""
    gpus_table = chk.table(data, "gpus")
    try:
        return Assignment.from_mapping(gpus_table)
    except AssignmentError:
        pass
    valid: dict[str, Any] = {}
    # Re-check key by key so each message carries its own line.
    for role, value in gpus_table.items():
        if role == "share":
            if not isinstance(value, bool):
                chk.add("gpus.share", f"expected true or false, got {value!r} ({type_name(value)})")
        elif role == "exclusive":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                chk.add("gpus.exclusive", f"expected a list of role names, got {value!r}")
        else:
            try:
                parse_gpus(value, owner=f"role {role!r}")
                valid[role] = value
            except ValueError as err:
                chk.add(f"gpus.{role}", str(err))
    return Assignment.from_mapping(valid) if valid else None


def _check_slurm(chk: Checker, data: dict[str, Any]) -> SlurmSpec | None:
    """`[slurm]` when the recipe has one; None also when it has mistakes."""
    if "slurm" not in data:
        return None
    table = data["slurm"]
    if not isinstance(table, dict):
        chk.add("slurm", f"expected a table, got {type_name(table)}")
        return None
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


def _builtins(path: str, ctx: Mapping[str, str]) -> dict[str, str]:
    """The built-in placeholders; one the context does not give yet shows as <name>."""
    recipe_dir = str(Path(path).resolve().parent) if not path.startswith("<") else os.getcwd()
    return {
        "run_id": ctx.get("run_id", "<run_id>"), "run_dir": ctx.get("run_dir", "<run_dir>"),
        "workspace": ctx.get("workspace", "<workspace>"), "cache_dir": ctx.get("cache_dir", "<cache_dir>"),
        "recipe_dir": recipe_dir, "python": sys.executable,
    }


def _gpu_values(assignment: Assignment | None) -> dict[str, dict[str, str]]:
    """What `{gpus.ROLE}` and `{nproc.ROLE}` stand for."""
    roles = assignment.roles.items() if assignment else []
    return {
        "gpus": {r: format_gpus(g.gpus) for r, g in roles},
        "nproc": {r: str(g.nproc) for r, g in roles},
    }


def _check_jobs(chk: Checker, jobs_raw: dict[str, Any], assignment: Assignment | None, sub: Substituter,
                builtins: Mapping[str, str]) -> dict[str, JobSpec]:
    """Every valid job's spec (a job with mistakes is left out: its problems are in `chk`)."""
    if not jobs_raw:
        chk.add("jobs", "the recipe has no jobs: add [jobs.NAME] tables or [[job]] entries")
    jobs: dict[str, JobSpec] = {}
    for jname, jtable in jobs_raw.items():
        key = f"jobs.{jname}"
        if not re.match(r"^[A-Za-z0-9_\-]+$", jname):
            chk.add(key, "job names use letters, digits, '_' and '-' (they name log files)")
            continue
        if not isinstance(jtable, dict):
            chk.add(key, f"expected a table, got {type_name(jtable)}")
            continue
        spec = check_job(chk, jname, jtable, key, assignment, sub, builtins)
        if spec is not None:
            jobs[jname] = spec
    return jobs


def _check_graph(chk: Checker, jobs_raw: dict[str, Any]) -> None:
    """`after`: unknown jobs, self-waits and cycles.

    Read from the raw tables, so the graph is checked even when a job has other mistakes.
    """
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


# -- recipe files -----------------------------------------------------------------------------------------


def load_recipe(
    path: str | os.PathLike, overrides: Iterable[str] = (), *, context: Mapping[str, str] | None = None
) -> Recipe:
    """Read and validate a recipe file (a bare name looks in configs/recipes/)."""
    file = find_recipe(path)
    try:
        text = file.read_text()
    except FileNotFoundError:
        names = ", ".join(p.stem for p in shipped_recipes())
        problem = Problem("", f"no such recipe file, nor a shipped recipe of that name (shipped: {names})")
        raise RecipeError(str(path), [problem]) from None
    except OSError as err:
        problem = Problem("", f"cannot read the recipe: {err.strerror or err}")
        raise RecipeError(str(path), [problem]) from None
    except UnicodeDecodeError as err:
        problem = Problem("", f"not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
                              "a recipe is a TOML file")
        raise RecipeError(str(file), [problem]) from None
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
    """The recipes that come with adaflash (configs/recipes/*.toml), sorted by file name."""
    return sorted(RECIPES_DIR.glob("*.toml"))


__all__ = ["RecipeError", "find_recipe", "load_recipe", "parse_recipe", "shipped_recipes"]
