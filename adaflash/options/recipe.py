"""The recipe group: how `adaflash run` plans and supervises a recipe; and the run log's runs commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting


@dataclass(frozen=True)
class RecipeConfig(Settings):
    GROUP: ClassVar[str] = "plan"  # not "recipe": `adaflash run RECIPE` names its argument so

    overrides: tuple[str, ...] = setting((), Rule(str, multiple=True, flag="--set", metavar="KEY.PATH=VALUE",
                                                  help="Override a recipe value (TOML literal, else a string), e.g. "
                                                       "--set gpus.training=[1,2]."))
    detach: bool = setting(False, Rule(bool, flag="--detach", help="Supervise in the background; follow with "
                                                                    "`adaflash runs attach RUN`."))
    backend: str = setting("local", Rule(str, choices=("local", "slurm"), flag="--backend",
                                         help="local: subprocesses here; slurm: an sbatch script submitted to the "
                                              "cluster."))
    no_cache: bool = setting(False, Rule(bool, flag="--no-cache",
                                         help="Run every job, even those whose outputs an earlier run left with the "
                                              "same inputs (their cache records are refreshed)."))
    rerun: tuple[str, ...] = setting((), Rule(str, multiple=True, flag="--rerun", metavar="JOB",
                                              help="Run this job even if its cached outputs match (repeatable); the "
                                                   "jobs after it run again only if its outputs change."))
    progress_every: float = setting(30.0, Rule(float, low=1, flag="--progress-every",
                                               help="Without a terminal: seconds between progress lines while a job "
                                                    "runs."))
    list_recipes: bool = setting(False, Rule(bool, flag="--list", help="List the shipped recipes and exit."))
    supervise_run: str | None = setting(None, Rule(str, optional=True, flag="--foreground-supervisor", hidden=True,
                                                   metavar="RUN_ID",
                                                   help="Internal: supervise an already recorded run (the --detach "
                                                        "background process)."))


@dataclass(frozen=True)
class RunsConfig(Settings):
    """Which runs a command lists, and how it stops one."""

    GROUP: ClassVar[str] = "runs"

    kind: str | None = setting(None, Rule(str, optional=True, flag="--kind",
                                          help="Only runs of this kind (generate, pipeline, bench, ...)."))
    status: str | None = setting(None, Rule(str, optional=True, flag="--status", help="Only runs with this status."))
    grace: float = setting(10.0, Rule(float, low=0, flag="--grace",
                                      help="Seconds between SIGTERM and SIGKILL for each job."))
    job_name: str | None = setting(None, Rule(str, optional=True, flag="--job",
                                              help="Stop only this job (asked of the run's supervisor)."))
    restart: bool = setting(False, Rule(bool, flag="--restart", help="With --job: restart that job instead of "
                                                                      "stopping it."))
    watch: bool = setting(False, Rule(bool, flag="--watch", help="Refresh until Ctrl-C."))
