"""A launch as the dashboard's form states it -> the recipe that `jobs` plans, validates and starts.

Why a recipe even for one server: `jobs` is the only thing that starts processes (leases,
supervision, detach, logs, the run log), and it speaks recipes. A method choice becomes a
one-job recipe written into the workspace (kept, so the launch can be repeated with
`adaflash run <file>`); a recipe choice becomes `--set` overrides of the chosen recipe. Which
command and flags each launch means lives here, not in the TUI, which only asks; every check of
the result is `jobs.plan.prepare`'s.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from adaflash.methods import ONLINE_TRAINABLE, TABLE, VANILLA, method_of
from adaflash.models.builtin_drafters import OFFLINE_INIT, builtin_drafter_of
from jobs.launch_checks import Missing, drafts_of, integer, minutes, warn_dataset, warn_missing, warn_target

PRESETS = (("adaflash", "AdaFlash"), ("osd", "OSD"))
SERVER_METHODS = tuple((m.name, m.display) for m in TABLE)  # (name, what the form shows)
DEFAULT_ROLES = ("inference", "training", "server")
ROLES_OF_MODE = {"pipeline": ("inference", "training"), "server": ("server",), "bench": ("server",)}


def roles_of(mode: str, adapt: bool = False) -> tuple[str, ...]:
    """The GPU roles a method mode uses: an adapting server's trainer takes the training role."""
    return ROLES_OF_MODE[mode] + (("training",) if mode == "server" and adapt else ())

# Seconds a pipeline job gets to stop cleanly when its run is stopped: the workers finish the step in
# flight and publish (a CPU training step takes ~45 s, the pipeline's own grace is 60 s).
PIPELINE_STOP_GRACE = 120.0
HEADER = "# Written by adaflash-tui; run it again with: adaflash run <this file>\n"


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
    adapt: bool = False  # server mode: `serve --adapt`, its trainer on the training role

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
    prepare: list[str] = field(default_factory=list)  # built-in datasets to prepare before it can launch


@dataclass
class _Job:
    """One method mode's job: its recipe name, description and the `[jobs.NAME]` table."""

    name: str
    description: str
    table: dict[str, Any]


def _pipeline(choice: LaunchChoice, workspace: Path | None, errors: list[str], warnings: list[str],
              missing: list[Missing]) -> _Job:
    target, draft, dataset = choice.target.strip(), choice.draft.strip(), choice.dataset.strip()
    if not draft and not builtin_drafter_of(target, OFFLINE_INIT):
        errors.append("drafter: required (the initial drafter folder, e.g. an offline DFlash)")
    if not dataset:
        errors.append("dataset: required (prompts as a .jsonl file or a prepared dataset's name)")
    warn_missing(draft, "drafter", warnings, missing)
    warn_dataset(dataset, "train", workspace, warnings, missing)
    samples = integer(choice.max_samples, "max samples", errors, optional=True)
    new_tokens = integer(choice.max_new_tokens, "max new tokens", errors, optional=True)
    batch = integer(choice.batch_size, "batch size", errors, optional=True)
    budget = minutes(choice.max_minutes, errors)
    command = ["adaflash", "pipeline", "--target", target, *(["--draft", draft] if draft else []), "--data", dataset,
               "--infer-gpus", "{gpus.inference}", "--train-gpus", "{gpus.training}", "--preset", choice.preset]
    for flag, value in (("--max-samples", samples), ("--max-new-tokens", new_tokens), ("--batch-size", batch),
                        ("--max-minutes", budget)):
        if value:
            command += [flag, str(int(value)) if float(value).is_integer() else str(value)]
    return _Job(f"tui-pipeline-{choice.preset}",
                f"{dict(PRESETS).get(choice.preset, choice.preset)} pipeline from adaflash-tui",
                {"command": command, "gpus": ["inference", "training"], "stop_grace": PIPELINE_STOP_GRACE})


def _server(choice: LaunchChoice, errors: list[str], warnings: list[str], missing: list[Missing]) -> _Job:
    target, draft = choice.target.strip(), choice.draft.strip()
    port = integer(choice.port, "port", errors, low=1, high=65535) or 0
    if choice.method != VANILLA and not draft and not builtin_drafter_of(target, choice.method):
        errors.append(f"drafter: required for {choice.method} (a drafter folder)")
    warn_missing(draft, "drafter", warnings, missing)
    command = ["adaflash", "serve", "--method", choice.method, "--target", target,
               *(["--draft", draft] if draft else []), "--port", str(port), "--gpus", "{gpus.server}"]
    placement: dict[str, Any] = {"role": "server"}
    if choice.adapt:
        if choice.method not in ONLINE_TRAINABLE:
            errors.append(f"learn the traffic: needs DFlash, AdaFlash or OSD (it trains DFlash drafters), "
                          f"not {choice.method}")
        command += ["--adapt", "--train-gpus", "{gpus.training}"]
        placement = {"gpus": ["server", "training"]}
    return _Job(f"tui-serve-{choice.method}{'-adapt' if choice.adapt else ''}",
                f"{dict(SERVER_METHODS).get(choice.method, choice.method)} server from adaflash-tui"
                + (", learning its traffic" if choice.adapt else ""),
                {"command": command, "kind": "service", **placement,
                 "ready": {"http": f"http://127.0.0.1:{port}/health", "timeout": 900}})


def _bench(choice: LaunchChoice, workspace: Path | None, errors: list[str], warnings: list[str],
           missing: list[Missing]) -> _Job:
    target, dataset = choice.target.strip(), choice.dataset.strip()
    methods = tuple(choice.bench_methods)
    if not methods:
        errors.append("methods: pick at least one")
    elif VANILLA not in methods:
        warnings.append("no Vanilla in the matrix: speed-ups need a Vanilla row of the same run")
    if not dataset:
        errors.append("dataset: required (prepared names or FILE.jsonl, comma separated)")
    for each in (d.strip() for d in dataset.split(",") if d.strip()):
        warn_dataset(each, "test", workspace, warnings, missing)
    drafts = drafts_of(choice.draft, methods, errors)
    for spec in drafts:
        method, _, folder = spec.partition("=")
        if method not in methods:
            errors.append(f"drafter: {method}= names no method of the matrix ({', '.join(methods) or 'none'})")
        warn_missing(folder, f"drafter of {method}", warnings, missing)
    given = {d.split("=", 1)[0] for d in drafts}
    missing = [m for m in methods if method_of(m).needs_draft_on("embedded") and m not in given
               and not builtin_drafter_of(target, m)]
    if missing:
        errors.append(f"drafter: required for {', '.join(missing)} (DIR, or method=DIR,...)")
    conc = [c.strip() for c in choice.concurrency.split(",") if c.strip()]
    for c in conc or [""]:
        integer(c, "concurrency", errors)
    prompts = integer(choice.num_prompts, "prompts", errors) or 1
    command = ["adaflash", "bench", "matrix", "--methods", ",".join(methods), "--datasets", dataset,
               "--concurrency", ",".join(conc), "--target", target]
    for d in drafts:
        command += ["--draft", d]
    command += ["--num-prompts", str(prompts), "--gpus", "{gpus.server}"]
    return _Job("tui-bench-matrix", "benchmark matrix from adaflash-tui", {"command": command, "role": "server"})


def method_recipe(choice: LaunchChoice, workspace: Path | None = None, *,
                  missing: list[Missing] | None = None) -> tuple[str, list[str], list[str]]:
    """(recipe TOML text, form errors, warnings) for a method mode; with the `workspace`, datasets given by
    name are looked for in it. Paths not there now are warnings (the recipe may be run later, after
    something made them) and, when `missing` is given, are also appended to it."""
    errors: list[str] = []
    warnings: list[str] = []
    missing = [] if missing is None else missing
    if not choice.target.strip():
        errors.append("target: required (a built-in name, HF id or folder)")
    warn_target(choice.target.strip(), warnings, missing)
    if choice.mode == "pipeline":
        job = _pipeline(choice, workspace, errors, warnings, missing)
    elif choice.mode == "server":
        job = _server(choice, errors, warnings, missing)
    elif choice.mode == "bench":
        job = _bench(choice, workspace, errors, warnings, missing)
    else:
        raise ValueError(f"not a method mode: {choice.mode!r}")
    roles = choice.role_map
    gpus: dict[str, Any] = {role: _gpus(roles.get(role)) for role in roles_of(choice.mode, choice.adapt)}
    recipe = {"run": {"name": job.name, "description": job.description}, "gpus": {**gpus, "share": choice.share},
              "jobs": {job.name.split("-", 1)[1].replace("-", "_"): job.table}}
    return HEADER + tomli_w.dumps(recipe), errors, warnings


def _gpus(gpus: tuple[int, ...] | None) -> str | list[int]:
    return "cpu" if gpus is None else list(gpus)


def _override_gpus(gpus: tuple[int, ...] | None) -> str:
    return "cpu" if gpus is None else "[" + ",".join(str(i) for i in gpus) + "]"


def recipe_overrides(choice: LaunchChoice) -> tuple[list[str], list[str]]:
    """(--set overrides, errors) of a recipe mode: the roles the user edited, share, typed --set."""
    errors: list[str] = []
    overrides = [f"gpus.{role}={_override_gpus(gpus)}" for role, gpus in choice.roles if role in choice.edited]
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
    missing: list[Missing] = []
    text, errors, warnings = method_recipe(choice, workspace, missing=missing)
    # Launched now, the one job runs first: what is not there now fails it at its start (exit 2).
    errors += [m.error for m in missing]
    warnings = [w for w in warnings if w not in {m.warning for m in missing}]
    prepare = list(dict.fromkeys(m.dataset for m in missing if m.dataset))
    name = f"tui-{choice.mode}-{final}.toml" if final else f"tui-draft-{choice.mode}.toml"
    return Built(str(recipes_dir / name), text, [], errors, warnings, prepare)


def prepare_recipe(datasets: list[str]) -> str:
    """The recipe that prepares built-in datasets in the run's workspace, one job each (the form's offer)."""
    jobs = {f"prepare_{name.replace('-', '_')}": {"command": ["adaflash", "data", "prepare", name]}
            for name in datasets}
    recipe = {"run": {"name": f"tui-data-prepare-{'-'.join(datasets)}",
                      "description": f"adaflash data prepare {', '.join(datasets)}, from adaflash-tui"},
              "jobs": jobs}
    return HEADER + tomli_w.dumps(recipe)


def default_roles(indices: list[int]) -> dict[str, tuple[int, ...] | None]:
    """A sensible first assignment: inference and the server on the first GPU, training on the rest."""
    if not indices:
        return {role: None for role in DEFAULT_ROLES}
    first, rest = indices[0], indices[1:]
    return {"inference": (first,), "training": tuple(rest) if rest else (first,), "server": (first,)}
