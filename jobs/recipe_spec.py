"""What a validated recipe is: its jobs (JobSpec), their readiness and restart rules, the run.

These are plain data, built by jobs.recipe after every check passed (so nothing here validates),
and written to the run log as the run's config (`to_dict`) so that a detached supervisor or a
Slurm tracker can rebuild the exact same recipe (`from_dict`) without the TOML file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from jobs.argv import resolve_head, torchrun_launcher, torchrun_tail
from jobs.assign import CPU, Assignment, AssignmentError, Claim, check_conflicts, check_known, format_gpus
from jobs.dag import ancestors_of, topo_order

JOB_KINDS = ("task", "service")
RESTART_MODES = ("never", "on-failure")
DEFAULT_CODE = ["adaflash"]


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
    """Whether a job that failed is started again, how often, and after what back-off."""

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
    progress_count: bool = False  # progress = how many times the metric was reported (e.g. per benchmark cell)
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
    """`[slurm]`: what the sbatch script asks the cluster for, and how each node sets itself up."""

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
    """A validated recipe: run settings, resolved vars, the GPU assignment and the jobs (recipe order)."""

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
            "path": self.path, "name": self.name, "description": self.description,
            "workspace": self.workspace,
            "vars": dict(self.vars),
            "gpus": {**{r: (CPU if g.gpus is None else list(g.gpus))
                        for r, g in self.assignment.roles.items()},
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
