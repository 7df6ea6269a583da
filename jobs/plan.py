"""Planning a run: a recipe bound to a run id, run folder and workspace, and what it would start.

`prepare` validates and resolves a recipe for a new run without creating anything; the plan
(`PreparedRun.plan`, `plan_text`) shows each job's exact argv, GPUs and conditions, and what the
cache would do with it (what `adaflash run --dry-run` prints and the TUI's launch pane shows).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaflash.runlog import new_run_id
from adaflash.workspace import DEFAULT_WORKSPACE, WORKSPACE_ENV
from jobs.cache import JobCache
from jobs.recipe import load_recipe
from jobs.recipe_spec import Recipe


@dataclass
class PlanRow:
    """One job as it will start: the exact argv, its GPUs and its conditions."""

    name: str
    kind: str
    role: str | None
    gpus: str
    cuda_visible_devices: str | None
    after: list[str]
    ready: str | None
    restart: str
    argv: list[str]
    env: dict[str, str]
    log_path: str
    outputs: list[str] = field(default_factory=list)
    cache: str | None = None  # what a run started now would do with the job's cache record

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "command_line": self.command_line}


@dataclass
class PreparedRun:
    """A validated recipe bound to a run id, run folder and workspace; nothing started yet."""

    recipe: Recipe
    run_id: str
    run_dir: Path
    workspace: Path

    @property
    def cache_dir(self) -> Path | None:
        raw = self.recipe.context.get("cache_dir")
        return Path(raw) if raw else None

    def job_cache(self) -> JobCache | None:
        if self.cache_dir is None:
            return None
        return JobCache(self.cache_dir, safe_roots=[self.workspace], packages=self.recipe.code, workspace=self.workspace,
                        protected=[self.workspace / "runs", self.workspace / "runlog.sqlite"])

    def cache_preview(self, rerun: Iterable[str] = ()) -> dict[str, str]:
        """For each cacheable job, what a run started now would do: reuse it (and from which run) or run it.

        A job can only be foreseen as reused when every job it comes after is too.
        """
        cache = self.job_cache()
        if cache is None:
            return {}
        rerun = set(rerun)
        digests: dict[str, str] = {}
        out: dict[str, str] = {}
        for name in self.recipe.order():
            spec = self.recipe.jobs[name]
            if not spec.cacheable:
                continue
            if any(d not in digests for d in spec.after) or name in rerun:
                out[name] = "runs (asked)" if name in rerun else "runs (an earlier job runs)"
                continue
            record = cache.lookup(spec, cache.key(spec, {d: digests[d] for d in spec.after}))
            if record:
                digests[name] = record["outputs_digest"]
                out[name] = f"reused (outputs of run {record.get('run_id')})"
            else:
                out[name] = "runs (no record with this key)" if cache.record(name) is None else \
                    "runs (command, code or inputs changed, or outputs missing)"
        return out

    def plan(self, python: str | None = None, *, preview: bool = False, use_cache: bool = True,
             rerun: Iterable[str] = ()) -> list[PlanRow]:
        """The jobs in start order; `preview` also says what the cache would do (see cache_preview)."""
        rows = []
        cached = {}
        if preview:
            cached = self.cache_preview(rerun) if use_cache else {
                n: "runs (--no-cache)" for n, j in self.recipe.jobs.items() if j.cacheable}
        for name in self.recipe.order():
            spec = self.recipe.jobs[name]
            restart = "never" if spec.restart.mode == "never" else (
                f"on-failure (max {spec.restart.max_restarts}, back-off {spec.restart.backoff:g}s)")
            rows.append(PlanRow(
                name=name, kind=spec.kind, role=spec.role, gpus=spec.gpus_label,
                cuda_visible_devices=spec.cuda_visible_devices, after=list(spec.after),
                ready=(f"{spec.ready.describe()} within {spec.ready.timeout:g}s" if spec.ready else None),
                restart=restart, argv=spec.argv(python), env=dict(spec.env),
                log_path=str(self.run_dir / f"{name}.log"),
                outputs=list(spec.outputs) if spec.cacheable else [],
                cache=cached.get(name),
            ))
        return rows

    def plan_text(
        self, python: str | None = None, *, use_cache: bool = True, rerun: Iterable[str] = ()
    ) -> str:
        """The plan as plain text: what `adaflash run --dry-run` prints."""
        lines = [f"run {self.run_id}: recipe {self.recipe.name} ({self.recipe.path})",
                 f"workspace {self.workspace}", f"run folder {self.run_dir}"]
        if self.cache_dir and any(j.cacheable for j in self.recipe.jobs.values()):
            lines.append(f"cache folder {self.cache_dir}")
        if self.recipe.assignment.roles:
            roles = ", ".join(f"{r}={g.cuda_visible_devices or 'cpu'}"
                              for r, g in self.recipe.assignment.roles.items())
            lines.append(f"gpus {roles} (share={'yes' if self.recipe.assignment.share else 'no'})")
        for i, row in enumerate(self.plan(python, preview=True, use_cache=use_cache, rerun=rerun), start=1):
            visible = ("(unset: places its own workers)" if row.cuda_visible_devices is None
                       else repr(row.cuda_visible_devices))
            lines.append(f"\n{i}. {row.name} [{row.kind}{', role ' + row.role if row.role else ''}] "
                         f"GPUs {row.gpus}, CUDA_VISIBLE_DEVICES={visible}")
            if row.after:
                lines.append(f"   after: {', '.join(row.after)}")
            if row.ready:
                lines.append(f"   ready: {row.ready}")
            if row.restart != "never":
                lines.append(f"   restart: {row.restart}")
            for key, value in row.env.items():
                lines.append(f"   env: {key}={value}")
            lines.append(f"   $ {row.command_line}")
            lines.append(f"   log: {row.log_path}")
            if row.outputs:
                lines.append(f"   outputs (cached): {', '.join(row.outputs)}"
                             + (f" -> {row.cache}" if row.cache else ""))
        return "\n".join(lines)


def workspace_path(explicit: str | os.PathLike | None = None) -> Path:
    """Where the workspace is (as adaflash.workspace decides), not created: a plan has no side effects."""
    raw = explicit or os.environ.get(WORKSPACE_ENV) or DEFAULT_WORKSPACE
    return Path(raw).expanduser().resolve()


def prepare(
    recipe_path: str | os.PathLike,
    overrides: Iterable[str] = (),
    *,
    workspace: str | os.PathLike | None = None,
    run_id: str | None = None,
) -> PreparedRun:
    """Load and validate a recipe for a new run (RecipeError on any mistake). Creates no run."""
    overrides = list(overrides)
    first = load_recipe(recipe_path, overrides)  # validates, and tells the recipe's own workspace
    ws = workspace_path(workspace or first.workspace)
    run_id = run_id or new_run_id("recipe")
    run_dir = ws / "runs" / run_id
    cache_dir = ws / Path(first.cache_dir).expanduser() if first.cache_dir else ws / "cache" / first.name
    context = {"run_id": run_id, "run_dir": str(run_dir), "workspace": str(ws), "cache_dir": str(cache_dir)}
    recipe = load_recipe(recipe_path, overrides, context=context)
    return PreparedRun(recipe=recipe, run_id=run_id, run_dir=run_dir, workspace=ws)
