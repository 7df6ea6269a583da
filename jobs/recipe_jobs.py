"""Checking one job of a recipe (`[jobs.NAME]` or a `[[job]]` entry) into a JobSpec.

Each part of a job (command, GPUs, readiness, restarts, env, torchrun, caching, progress) has its
own check; they report into the shared Checker in the order of the keys' meaning, so a job's
messages always come out in the same order. Placeholders are filled as values are read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jobs.assign import CPU, Assignment, RoleGPUs, parse_gpus
from jobs.placeholders import Substituter
from jobs.recipe_checker import Checker, scalar_text, type_name
from jobs.recipe_spec import JOB_KINDS, RESTART_MODES, JobSpec, ReadyCheck, RestartPolicy

_JOB_KEYS = {
    "name", "description", "command", "kind", "role", "gpus", "after", "ready", "restart", "max_restarts",
    "backoff", "backoff_max", "env", "torchrun", "cwd", "stop_grace", "node", "nodes",
    "outputs", "inputs", "cache", "progress", "summary",
}
_PROGRESS_KEYS = {"total", "metric", "count"}
_READY_KEYS = {"http", "log", "timeout", "interval"}
_TORCHRUN_KEYS = {"nproc", "args"}

GpuRoles = dict[str, list[int] | None]  # role -> the GPUs a job claims of it (None: CPU)


def check_job(
    chk: Checker, name: str, table: dict[str, Any], key: str, assignment: Assignment | None,
    sub: Substituter, builtins: Mapping[str, str],
) -> JobSpec | None:
    """The job's spec, or None when it has mistakes (each one recorded in `chk`)."""
    chk.unknown_keys(table, _JOB_KEYS, key)
    n_problems = len(chk.problems)
    command = _check_command(chk, table, key)
    kind = chk.choice(table, "kind", key, JOB_KINDS, "task")
    role = chk.typed(table, "role", key, (str,), "a role name (string)")
    after = _check_after(chk, table, key)
    gpu_roles, launcher = _check_gpus(chk, name, table, key, role, assignment)
    ready = _check_ready(chk, table, key, sub)
    policy = _check_restart(chk, table, key)
    env = _check_env(chk, table, key, sub)
    nproc, tr_args = _check_torchrun(chk, table, key, gpu_roles)
    if command is not None:
        command = [sub(c, f"{key}.command") if isinstance(c, str) else c for c in command]
    cwd = chk.typed(table, "cwd", key, (str,), "a folder path string")
    stop_grace = chk.typed(table, "stop_grace", key, (int, float), "a number of seconds")
    node = chk.typed(table, "node", key, (int,), "a node index (integer >= 0)")
    nodes = chk.typed(table, "nodes", key, (int,), "a number of nodes (integer >= 1)")
    description = chk.typed(table, "description", key, (str,), "a string")
    outputs = _paths(chk, table, "outputs", key, sub)
    inputs = _paths(chk, table, "inputs", key, sub)
    cache = chk.typed(table, "cache", key, (bool,), "true or false")
    summary = chk.typed(table, "summary", key, (bool,), "true or false")
    _check_reusable(chk, key, kind, command, outputs, cache, builtins)
    total, metric, count = _check_progress(chk, table, key, sub)
    if len(chk.problems) > n_problems:
        return None
    return JobSpec(
        name=name, command=list(command), kind=kind, role=role,
        gpu_roles=gpu_roles, launcher=launcher, after=after, ready=ready, restart=policy, env=env,
        torchrun_nproc=nproc, torchrun_args=tr_args, cwd=sub(cwd, f"{key}.cwd") if cwd else None,
        stop_grace=float(10.0 if stop_grace is None else stop_grace), node=node or 0, nodes=nodes,
        description=description, outputs=outputs, inputs=inputs, cache=cache is not False,
        progress_total=total, progress_metric=metric, progress_count=count, summary=bool(summary),
    )


def _check_command(chk: Checker, table: dict[str, Any], key: str) -> list[Any] | None:
    """The argv as written (a list, never a shell string); None when absent or not a list."""
    command = chk.typed(table, "command", key, (list,), "a list of strings (argv, never a shell string)",
                        required=True)
    if command is not None:
        if not command:
            chk.add(f"{key}.command", "expected a non-empty list of strings (argv)")
        for i, item in enumerate(command):
            if not isinstance(item, str):
                chk.add(f"{key}.command", f"item {i}: expected a string, got {item!r} ({type_name(item)})")
    return command


def _check_after(chk: Checker, table: dict[str, Any], key: str) -> list[str]:
    """The job names it waits for (whether they exist is checked with the whole graph)."""
    after = chk.typed(table, "after", key, (list,), "a list of job names") or []
    for item in after:
        if not isinstance(item, str):
            chk.add(f"{key}.after", f"expected job names (strings), got {item!r} ({type_name(item)})")
    return [a for a in after if isinstance(a, str)]


def _check_gpus(
    chk: Checker, name: str, table: dict[str, Any], key: str, role: str | None, assignment: Assignment | None,
) -> tuple[GpuRoles, bool]:
    """The GPUs the job claims per role, and whether it is a launcher (its gpus span several roles)."""
    roles = assignment.roles if assignment else {}
    if "gpus" in table:
        return _gpus_value(chk, name, table["gpus"], key, role, roles)
    gpu_roles: GpuRoles = {}
    if role is not None:
        if role in roles:
            gpus = roles[role].gpus
            gpu_roles[role] = None if gpus is None else list(gpus)
        elif assignment is not None:
            chk.add(f"{key}.role", f"role {role!r} has no GPUs in [gpus]: add `{role} = [...]` or "
                                   f"`{role} = \"cpu\"` there, or give the job `gpus`")
    return gpu_roles, False


def _gpus_value(
    chk: Checker, name: str, value: Any, key: str, role: str | None, roles: Mapping[str, RoleGPUs],
) -> tuple[GpuRoles, bool]:
    """`gpus = ...`: a role name, several role names, "cpu", or explicit indices."""
    gpu_roles: GpuRoles = {}
    launcher = False
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
        return gpu_roles, launcher
    try:
        gpus = parse_gpus(value, owner="value")
        gpu_roles[role or f"job:{name}"] = None if gpus is None else list(gpus)
    except ValueError as err:
        expected = "expected a role name, a list of role names, \"cpu\", a GPU index or a list of GPU indices"
        if isinstance(value, bool) or not isinstance(value, (str, int, list)):
            chk.add(f"{key}.gpus", f"{expected}, got {value!r} ({type_name(value)})")
        else:
            hint = f" (roles in [gpus]: {', '.join(roles) or 'none'})" if isinstance(value, str) else ""
            chk.add(f"{key}.gpus", f"{str(err).removeprefix('value: ')}{hint}")
    return gpu_roles, launcher


def _check_ready(chk: Checker, table: dict[str, Any], key: str, sub: Substituter) -> ReadyCheck | None:
    """`ready = {http = URL}` or `{log = regex}`, with optional timeout and poll interval."""
    ready_table = chk.typed(table, "ready", key, (dict,),
                            "a table like {http = \"http://127.0.0.1:PORT/health\"} or {log = \"regex\"}")
    if ready_table is None:
        return None
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
    return ReadyCheck(http=sub(http, f"{rkey}.http") if http else None, log=log,
                      timeout=float(timeout or 300.0), interval=float(interval or 0.5))


def _check_restart(chk: Checker, table: dict[str, Any], key: str) -> RestartPolicy:
    """`restart`, `max_restarts`, `backoff`, `backoff_max` (defaults: those of RestartPolicy)."""
    mode = chk.choice(table, "restart", key, RESTART_MODES, "never")
    max_restarts = chk.typed(table, "max_restarts", key, (int,), "an integer >= 0")
    if max_restarts is not None and max_restarts < 0:
        chk.add(f"{key}.max_restarts", f"expected an integer >= 0, got {max_restarts}")
    backoff = chk.typed(table, "backoff", key, (int, float), "a number of seconds")
    backoff_max = chk.typed(table, "backoff_max", key, (int, float), "a number of seconds")
    for pname, pval in (("backoff", backoff), ("backoff_max", backoff_max)):
        if pval is not None and pval < 0:
            chk.add(f"{key}.{pname}", f"expected a number of seconds >= 0, got {pval!r}")
    return RestartPolicy(mode=mode, max_restarts=3 if max_restarts is None else max_restarts,
                         backoff=1.0 if backoff is None else float(backoff),
                         backoff_max=60.0 if backoff_max is None else float(backoff_max))


def _check_env(chk: Checker, table: dict[str, Any], key: str, sub: Substituter) -> dict[str, str]:
    """`env = {NAME = value}`: scalars only, as text, placeholders filled."""
    env: dict[str, str] = {}
    env_table = chk.typed(table, "env", key, (dict,), "a table of NAME = \"value\"") or {}
    for ename, evalue in env_table.items():
        text = scalar_text(evalue)
        if text is None:
            chk.add(f"{key}.env.{ename}", f"expected a string, number or boolean, got {type_name(evalue)}")
        else:
            env[ename] = sub(text, f"{key}.env.{ename}")
    return env


def _check_torchrun(chk: Checker, table: dict[str, Any], key: str,
                    gpu_roles: GpuRoles) -> tuple[int | None, list[str]]:
    """`torchrun = {nproc = N | "auto", args = [...]}`: processes per node (auto: one per GPU) and flags."""
    tr = chk.typed(table, "torchrun", key, (dict,), "a table like {nproc = 2} or {nproc = \"auto\"}")
    if tr is None:
        return None, []
    nproc = None
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
    return nproc, list(tr_args)


def _paths(chk: Checker, table: dict[str, Any], name: str, key: str, sub: Substituter) -> list[str]:
    """A list of path strings (outputs, inputs), placeholders filled."""
    value = chk.typed(table, name, key, (list,), "a list of file or folder paths") or []
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            chk.add(f"{key}.{name}", f"item {i}: expected a path string, got {item!r} ({type_name(item)})")
        else:
            out.append(sub(item, f"{key}.{name}"))
    return out


def _check_reusable(chk: Checker, key: str, kind: str, command: list[Any] | None, outputs: list[str],
                    cache: bool | None, builtins: Mapping[str, str]) -> None:
    """A job with outputs is reused by later runs (jobs.cache): only a task, and nothing run-specific."""
    if outputs and kind != "task":
        chk.add(f"{key}.outputs", "only a task (kind = \"task\") can have outputs: a service never finishes, "
                                  "so it is never reused")
    if outputs and cache is not False and command:
        # A reused job must mean the same thing in every run: run-specific paths change its key each time.
        per_run = [v for v in (builtins.get("run_id"), builtins.get("run_dir")) if v]
        texts = [c for c in command if isinstance(c, str)] + outputs  # command: already substituted
        if any(marker in text for text in texts for marker in per_run):
            chk.add(f"{key}.outputs", "a job with outputs is reused across runs, so neither its command nor "
                                      "its outputs may use {run_dir} or {run_id} (put them under "
                                      "{cache_dir}), or set cache = false")


def _check_progress(chk: Checker, table: dict[str, Any], key: str,
                    sub: Substituter) -> tuple[float | None, str | None, bool]:
    """`progress = {total, metric, count}`: how the display measures how far the job is."""
    progress = chk.typed(table, "progress", key, (dict,), "a table like {total = 60, metric = \"loss\"}")
    if progress is None:
        return None, None, False
    total = None
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
            chk.add(f"{pkey}.total",
                    f"expected a positive number (or a {{vars.NAME}} that is one), got {text!r}")
            total = None
    metric = chk.typed(progress, "metric", pkey, (str,), "a metric name (string)")
    count = chk.typed(progress, "count", pkey, (bool,), "true or false")
    if count and not metric:
        chk.add(f"{pkey}.count", "count = true counts the reports of a metric: give `metric` too")
    return total, metric, count is True
