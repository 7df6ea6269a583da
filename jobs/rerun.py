"""A past run, launched again: what its run-log record says, as a Launch form choice.

Why here and not in the TUI: "which fields of which run kind mean what" is control-plane knowledge
(the CLI records them, `jobs` builds the recipes), and the dashboard only shows the result. A recipe
run (form launches are recipe runs too) comes back as its recipe file; a pipeline, server or
benchmark started from the CLI comes back as the form's method mode, filled from the record.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jobs.launch_plan import PRESETS, Built, LaunchChoice, build, default_roles, roles_of

MODE_OF_KIND = {"pipeline": "pipeline", "serve": "server", "bench": "bench", "bench-matrix": "bench"}


@dataclass(frozen=True)
class Relaunch:
    """How to launch a run again: a recipe file, or form fields (LaunchChoice names) and GPU roles."""

    run_id: str
    mode: str  # "recipe" or a method mode of the Launch form
    recipe: str = ""
    overrides: tuple[str, ...] = ()  # recipe mode: the run's --set overrides, as recorded
    fields: dict[str, Any] = field(default_factory=dict)
    roles: dict[str, tuple[int, ...] | None] = field(default_factory=dict)

    def choice(self, base: LaunchChoice | None = None) -> LaunchChoice:
        """The form's choice: `base` (the form as it is) with this run's fields and roles."""
        base = base or LaunchChoice()
        if self.mode == "recipe":
            return replace(base, mode="recipe", recipe=self.recipe, sets=shlex.join(self.overrides), edited=())
        roles = {**base.role_map, **self.roles}
        used = [g for role in roles_of(self.mode, bool(self.fields.get("adapt"))) for g in (roles.get(role) or ())]
        share = base.share or len(used) != len(set(used))  # two roles on one GPU, as the run had them
        return replace(base, mode=self.mode, **self.fields, roles=tuple(sorted(roles.items())), share=share)

    def describe(self) -> str:
        """One line for the confirmation: what will start."""
        if self.mode == "recipe":
            return f"recipe {self.recipe}" + (f" with {shlex.join(self.overrides)}" if self.overrides else "")
        shown = {k: v for k, v in self.fields.items() if v not in ("", None, False, ())}
        facts = [f"{k}={','.join(v) if isinstance(v, tuple) else v}" for k, v in shown.items()]
        gpus = [f"{role} on {','.join(map(str, g)) if g else 'cpu'}" for role, g in sorted(self.roles.items())]
        return f"{self.mode}: " + " ".join(facts) + (f" ({'; '.join(gpus)})" if gpus else "")


class NotRelaunchable(ValueError):
    """The record does not say enough to launch the run again (the message says why)."""


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _gpus(value: Any) -> tuple[int, ...] | None:
    """`cpu`, "0,1" or [0, 1] as recorded -> a role's GPUs (None: CPU)."""
    items = value if isinstance(value, (list, tuple)) else str(value or "cpu").split(",")
    picked = tuple(int(v) for v in (str(i).strip() for i in items) if v.isdigit())
    return picked or None


def relaunch_of(run: dict[str, Any]) -> Relaunch:
    """The Relaunch of a run record (`RunLog.get_run`), or NotRelaunchable."""
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    kind = run.get("kind") or ""
    if kind == "recipe":
        path = config.get("path")
        if not path or not Path(path).is_file():
            raise NotRelaunchable(f"run {run['id']} was not started from a recipe file that is still there"
                                  + (f" ({path} is gone)" if path else ""))
        return Relaunch(run["id"], "recipe", recipe=str(path), overrides=tuple(config.get("overrides") or ()))
    mode = MODE_OF_KIND.get(kind)
    if mode is None:
        raise NotRelaunchable(f"run {run['id']} is a {kind or 'unknown'} run: only recipe, pipeline, server and "
                              "benchmark runs can be launched again from here")
    if config.get("imported_from"):
        raise NotRelaunchable(f"run {run['id']} holds imported results ({config['imported_from']}), not a launch")
    fields: dict[str, Any] = {"target": _text(run.get("target")), "draft": _text(run.get("draft"))}
    roles: dict[str, tuple[int, ...] | None] = {}
    if mode == "pipeline":
        preset = config.get("preset") or run.get("method")
        fields.update(dataset=_text(run.get("dataset")), max_samples=_text(config.get("max_samples")),
                      max_minutes=_text(config.get("max_minutes")),
                      batch_size=_text((config.get("engine_config") or {}).get("max_batch")))
        if preset in {value for value, _ in PRESETS}:
            fields["preset"] = preset
        roles = {"inference": _gpus(config.get("infer_gpus")), "training": _gpus(config.get("train_gpus"))}
    elif mode == "server":
        fields.update(method=_text(run.get("method")) or "vanilla", port=_text(config.get("port") or 30000),
                      adapt=bool(config.get("adapt")))
    else:
        methods = config.get("methods") or ([run["method"]] if run.get("method") else [])
        drafts = config.get("drafts") if isinstance(config.get("drafts"), dict) else {}
        fields.update(bench_methods=tuple(methods), dataset=_text(config.get("datasets") or run.get("dataset")),
                      concurrency=_text(config.get("concurrency") or 1), num_prompts=_text(config.get("num_prompts") or 16))
        if drafts:
            fields["draft"] = ",".join(f"{m}={d}" for m, d in drafts.items())
        if config.get("gpus"):
            roles = {"server": _gpus(config["gpus"])}
    known = set(roles_of(mode, bool(fields.get("adapt"))))
    return Relaunch(run["id"], mode, fields=fields, roles={r: g for r, g in roles.items() if r in known})


def relaunch_built(relaunch: Relaunch, recipes_dir: Path, workspace: Path, gpus: list[int], name: str) -> Built:
    """The recipe to launch the run again (a method recipe is written as tui-MODE-NAME.toml); roles the record
    does not name take the form's defaults for these GPUs."""
    if relaunch.mode == "recipe":  # the file as it is now, with the run's own overrides
        return Built(relaunch.recipe, None, list(relaunch.overrides))
    base = LaunchChoice(roles=tuple(sorted(default_roles(gpus).items())), share=len(gpus) < 2)
    return build(relaunch.choice(base), recipes_dir, final=name, workspace=workspace)
