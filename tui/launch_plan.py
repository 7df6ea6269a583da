"""The Launch form's choices -> the recipe that `jobs` plans, validates and starts.

Why a recipe even for one server: `jobs` is the only thing that starts processes (leases,
supervision, detach, logs, the run log), and it speaks recipes. A method choice becomes a
one-job recipe written into the workspace (kept, so the launch can be repeated with
`adaflash run <file>`); a recipe choice becomes `--set` overrides of the chosen recipe. This
module only writes text: every check of the result is `jobs.plan.prepare`'s.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from adaflash.data.prompts import PromptFileError, prompt_source
from adaflash.models.builtin_drafters import BUILTIN_DRAFTERS, OFFLINE_INIT, builtin_drafter_of
from jobs.assign import format_gpus

MODES = (("recipe", "Recipe"), ("pipeline", "Pipeline"), ("server", "Baseline server"),
         ("bench", "Benchmark matrix"))
PRESETS = (("adaflash", "AdaFlash"), ("osd", "OSD"))
SERVER_METHODS = (("vanilla", "Vanilla"), ("eagle3", "EAGLE-3"), ("dflash", "DFlash"), ("mtp", "MTP"),
                  ("osd", "OSD"), ("adaflash", "AdaFlash"))
DEFAULT_ROLES = ("inference", "training", "server")
ROLES_OF_MODE = {"pipeline": ("inference", "training"), "server": ("server",), "bench": ("server",)}

PIPELINE_STOP_GRACE = 120.0  # seconds a pipeline job gets to stop cleanly when its run is stopped

Roles = dict[str, "tuple[int, ...] | None"]


@dataclass(frozen=True)
class LaunchChoice:
    """What the form says, frozen so a worker can plan it while the user keeps typing."""

    mode: str = "recipe"
    recipe: str = ""
    sets: str = ""  # recipe mode: extra KEY.PATH=VALUE overrides, space separated
    preset: str = "adaflash"
    method: str = "vanilla"
    bench_methods: tuple[str, ...] = ("vanilla", "dflash", "adaflash")
    target: str = "smollm2-135m"
    draft: str = ""
    dataset: str = ""
    max_samples: str = ""
    max_new_tokens: str = ""  # pipeline: empty means the pipeline's own default
    batch_size: str = ""
    max_minutes: str = ""
    port: str = "30000"
    concurrency: str = "1"
    num_prompts: str = "16"
    roles: tuple[tuple[str, tuple[int, ...] | None], ...] = ()
    edited: tuple[str, ...] = ()  # roles (and "share") the user changed: recipe mode overrides only these
    share: bool = False

    @property
    def role_map(self) -> dict[str, tuple[int, ...] | None]:
        return dict(self.roles)


@dataclass
class Built:
    """The recipe to plan: a path (with its text to write first, for method modes) and overrides."""

    recipe_path: str | None
    recipe_text: str | None
    overrides: list[str]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def toml_str(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value, ensure_ascii=False)


def toml_gpus(gpus: tuple[int, ...] | None) -> str:
    return '"cpu"' if gpus is None else "[" + ", ".join(str(i) for i in gpus) + "]"


def override_gpus(gpus: tuple[int, ...] | None) -> str:
    return "cpu" if gpus is None else "[" + ",".join(str(i) for i in gpus) + "]"


def _int(text: str, what: str, errors: list[str], *, low: int = 1, high: int | None = None,
         optional: bool = False) -> int | None:
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


def _minutes(text: str, errors: list[str]) -> float | None:
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


def _exists_warning(value: str, what: str, warnings: list[str]) -> None:
    if value and "{" not in value and value not in BUILTIN_DRAFTERS and not Path(value).expanduser().exists():
        warnings.append(f"{what} {value!r} does not exist yet (the job fails unless it is created first)")


def _dataset_warning(value: str, split: str, workspace: Path | None, warnings: list[str]) -> None:
    """A prompt file or a prepared dataset's name, found as the job will look for it (`prompt_source`)."""
    if not value or "{" in value or workspace is None:
        return
    try:
        path = prompt_source(value, workspace, split)
    except PromptFileError as err:
        warnings.append(f"dataset {err}")
        return
    if not path.exists():
        warnings.append(f"dataset {value!r} does not exist yet (the job fails unless it is created first)")


def _target_warning(value: str, warnings: list[str]) -> None:
    """A target given as a path must be there; a hub id cannot be checked offline, a built-in name is known."""
    if value.startswith(("/", "./", "../", "~")) and not Path(value).expanduser().exists():
        warnings.append(f"target {value!r}: no such folder (a built-in name, a hub id or a model folder)")


def drafts_of(text: str, methods: tuple[str, ...], errors: list[str]) -> list[str]:
    """`DIR` (every non-vanilla method) or `method=DIR,method=DIR` -> bench matrix `--draft` values."""
    text = text.strip()
    if not text:
        return []
    if "=" not in text:
        return [f"{m}={text}" for m in methods if m != "vanilla"]
    out = []
    for part in text.split(","):
        method, _, folder = part.partition("=")
        if not method.strip() or not folder.strip():
            errors.append(f"drafter: expected DIR or method=DIR,method=DIR, got {part!r}")
            continue
        out.append(f"{method.strip()}={folder.strip()}")
    return out


def method_recipe(choice: LaunchChoice, workspace: Path | None = None) -> tuple[str, list[str], list[str]]:
    """(recipe TOML text, form errors, warnings) for a method mode; with the `workspace`, datasets given by
    name are looked for in it."""
    errors: list[str] = []
    warnings: list[str] = []
    roles = choice.role_map
    target = choice.target.strip()
    if not target:
        errors.append("target: required (a built-in name, HF id or folder)")
    _target_warning(target, warnings)
    draft, dataset = choice.draft.strip(), choice.dataset.strip()
    job: list[str] = []
    if choice.mode == "pipeline":
        name = f"tui-pipeline-{choice.preset}"
        description = f"{dict(PRESETS).get(choice.preset, choice.preset)} pipeline from adaflash-tui"
        if not draft and not builtin_drafter_of(target, OFFLINE_INIT):
            errors.append("drafter: required (the initial drafter folder, e.g. an offline DFlash)")
        if not dataset:
            errors.append("dataset: required (prompts as a .jsonl file or a prepared dataset's name)")
        _exists_warning(draft, "drafter", warnings)
        _dataset_warning(dataset, "train", workspace, warnings)
        samples = _int(choice.max_samples, "max samples", errors, optional=True)
        new_tokens = _int(choice.max_new_tokens, "max new tokens", errors, optional=True)
        batch = _int(choice.batch_size, "batch size", errors, optional=True)
        minutes = _minutes(choice.max_minutes, errors)
        command = ["adaflash", "pipeline", "--target", target, *(["--draft", draft] if draft else []), "--data", dataset,
                   "--infer-gpus", "{gpus.inference}", "--train-gpus", "{gpus.training}", "--preset", choice.preset]
        for flag, value in (("--max-samples", samples), ("--max-new-tokens", new_tokens), ("--batch-size", batch),
                            ("--max-minutes", minutes)):
            if value:
                command += [flag, str(int(value)) if float(value).is_integer() else str(value)]
        # A stop lets the workers finish the step in flight and publish (a CPU training step takes ~45 s,
        # the pipeline's own grace is 60 s) before anything is killed.
        job = [f"command = [{', '.join(toml_str(c) for c in command)}]", 'gpus = ["inference", "training"]',
               f"stop_grace = {PIPELINE_STOP_GRACE:g}"]
    elif choice.mode == "server":
        name = f"tui-serve-{choice.method}"
        description = f"{dict(SERVER_METHODS).get(choice.method, choice.method)} server from adaflash-tui"
        port = _int(choice.port, "port", errors, low=1, high=65535)
        if choice.method != "vanilla" and not draft and not builtin_drafter_of(target, choice.method):
            errors.append(f"drafter: required for {choice.method} (a drafter folder)")
        _exists_warning(draft, "drafter", warnings)
        command = ["adaflash", "serve", "--method", choice.method, "--target", target]
        if draft:
            command += ["--draft", draft]
        command += ["--port", str(port or 0), "--gpus", "{gpus.server}"]
        job = [f"command = [{', '.join(toml_str(c) for c in command)}]", 'kind = "service"', 'role = "server"',
               f"ready = {{ http = {toml_str(f'http://127.0.0.1:{port or 0}/health')}, timeout = 900 }}"]
    elif choice.mode == "bench":
        name = "tui-bench-matrix"
        description = "benchmark matrix from adaflash-tui"
        methods = tuple(choice.bench_methods)
        if not methods:
            errors.append("methods: pick at least one")
        elif "vanilla" not in methods:
            warnings.append("no Vanilla in the matrix: speed-ups need a Vanilla row of the same run")
        if not dataset:
            errors.append("dataset: required (prepared names or FILE.jsonl, comma separated)")
        for each in (d.strip() for d in dataset.split(",") if d.strip()):
            _dataset_warning(each, "test", workspace, warnings)
        drafts = drafts_of(draft, methods, errors)
        given = {d.split("=", 1)[0] for d in drafts}
        for spec in drafts:
            method, _, folder = spec.partition("=")
            if method not in methods:
                errors.append(f"drafter: {method}= names no method of the matrix ({', '.join(methods) or 'none'})")
            _exists_warning(folder, f"drafter of {method}", warnings)
        missing = [m for m in methods if m not in ("vanilla", "mtp") and m not in given
                   and not builtin_drafter_of(target, m)]
        if missing:
            errors.append(f"drafter: required for {', '.join(missing)} (DIR, or method=DIR,...)")
        conc = [c.strip() for c in choice.concurrency.split(",") if c.strip()]
        for c in conc or [""]:
            _int(c, "concurrency", errors)
        prompts = _int(choice.num_prompts, "prompts", errors)
        command = ["adaflash", "bench", "matrix", "--methods", ",".join(methods), "--datasets", dataset,
                   "--concurrency", ",".join(conc), "--target", target]
        for d in drafts:
            command += ["--draft", d]
        command += ["--num-prompts", str(prompts or 1), "--gpus", "{gpus.server}"]
        job = [f"command = [{', '.join(toml_str(c) for c in command)}]", 'role = "server"']
    else:
        raise ValueError(f"not a method mode: {choice.mode!r}")
    lines = ["# Written by adaflash-tui; run it again with: adaflash run <this file>", "[run]",
             f"name = {toml_str(name)}", f"description = {toml_str(description)}", "", "[gpus]"]
    for role in ROLES_OF_MODE[choice.mode]:
        gpus = roles.get(role)
        lines.append(f"{role} = {toml_gpus(gpus)}")
    lines += [f"share = {'true' if choice.share else 'false'}", "", f"[jobs.{name.split('-', 1)[1].replace('-', '_')}]"]
    lines += job
    return "\n".join(lines) + "\n", errors, warnings


def recipe_overrides(choice: LaunchChoice) -> tuple[list[str], list[str]]:
    """(--set overrides, errors) of a recipe mode: the roles the user edited, share, typed --set."""
    errors: list[str] = []
    overrides = [f"gpus.{role}={override_gpus(gpus)}" for role, gpus in choice.roles if role in choice.edited]
    if "share" in choice.edited:
        overrides.append(f"gpus.share={'true' if choice.share else 'false'}")
    try:
        typed = shlex.split(choice.sets)
    except ValueError as err:
        return overrides, [f"overrides: {err}"]
    for item in typed:
        if "=" not in item:
            errors.append(f"overrides: expected KEY.PATH=VALUE, got {item!r}")
        else:
            overrides.append(item)
    return overrides, errors


def build(choice: LaunchChoice, recipes_dir: Path, *, final: str | None = None,
          workspace: Path | None = None) -> Built:
    """What to plan for a choice. `final` names a method recipe for a launch (else a draft file)."""
    if choice.mode == "recipe":
        overrides, errors = recipe_overrides(choice)
        recipe = choice.recipe.strip()
        if not recipe:
            errors.append("recipe: pick one from the list or type a path to a .toml file")
            return Built(None, None, overrides, errors)
        return Built(recipe, None, overrides, errors)
    text, errors, warnings = method_recipe(choice, workspace)
    name = f"tui-{choice.mode}-{final}.toml" if final else f"tui-draft-{choice.mode}.toml"
    return Built(str(recipes_dir / name), text, [], errors, warnings)


def default_roles(indices: list[int]) -> dict[str, tuple[int, ...] | None]:
    """A sensible first assignment: inference and the server on the first GPU, training on the rest."""
    if not indices:
        return {role: None for role in DEFAULT_ROLES}
    first, rest = indices[0], indices[1:]
    return {"inference": (first,), "training": tuple(rest) if rest else (first,), "server": (first,)}


def describe_roles(roles: dict[str, tuple[int, ...] | None]) -> str:
    return ", ".join(f"{role}={format_gpus(gpus) if gpus != () else 'none'}" for role, gpus in roles.items())
