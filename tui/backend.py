"""The TUI's only door to the world: the run log, `jobs` and the comparison functions.

Every method may block (SQLite, NVML, process signals, files), so only thread workers call
them; they return plain data that the workers post to the widgets in messages. Nothing here
decides anything about experiments: it forwards to `jobs.*`, `adaflash.runlog` and
`adaflash.bench.compare`, and turns their results into small dataclasses the panes render.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from adaflash.runlog import RunLog
    from jobs.assign import GpuLeases
    from jobs.gpus import Snapshot
    from jobs.rerun import Relaunch
    from tui.sqlquery import QueryResult, Source

# The run log, `jobs` and the comparison are imported where first used, in a worker: importing them (SQLite
# helpers, numpy) took longer than drawing the first screen, which needs none of them.
LIVE_RUN_STATUSES = ("pending", "running", "detached")  # adaflash.runlog's, checked by a test
ACTIVE_JOB_STATUSES = ("starting", "running", "ready", "restarting")  # jobs.supervisor's ACTIVE and restarting

LOG_TAIL_BYTES = 32 * 1024
METRICS_PAGE = 20_000  # rows per read: bounds one UI-thread fold to ~0.1 s while catching up
EXPORTS_DIR = "exports"
HISTORY_LIMIT = 1000  # runs History lists at once (newest first); the filters and search reach every run
RUN_FILTERS = ("method", "target", "dataset", "status")
# How long a stop waits for a pipeline to finish its step and publish: a CPU training step takes ~45 s and
# the pipeline's own grace before it kills its workers is 60 s; past this the run is stopped outright.
PIPELINE_STOP_WAIT = 150.0


@dataclass
class RunIndex:
    runs: list[dict[str, Any]]
    total: int  # runs matching the filters, the listed ones included
    options: dict[str, tuple[str, ...]]
RECIPES_DIR = "recipes"


class InventoryLike(Protocol):
    def snapshot(self) -> Snapshot: ...


# -- results the workers post --------------------------------------------------------------------


@dataclass
class RunState:
    """A run, its jobs and the runs its jobs created (e.g. the pipeline run inside a recipe)."""

    run: dict[str, Any] | None
    jobs: list[dict[str, Any]]
    children: list[dict[str, Any]]
    supervisor_alive: bool
    live: bool
    time: float = field(default_factory=time.time)


@dataclass
class LogChunk:
    path: str | None
    offset: int
    text: str
    reset: bool  # the text replaces what is shown (first read, or the file was truncated)


@dataclass
class MetricsBatch:
    """New metric rows per run id (cursor semantics: every id > the cursor asked for)."""

    run_id: str
    sources: dict[str, str]  # run id -> label ("" for the run itself, else the job that created it)
    rows: dict[str, list[dict[str, Any]]]
    more: bool  # a page was full: read again at once (catching up on a large log)
    statuses: dict[str, str] = field(default_factory=dict)  # run id -> its status now (ended: no "in flight")


@dataclass
class LaunchPlan:
    """What a launch would start: the exact plan text, its roles, and every problem found."""

    plan_text: str | None
    roles: dict[str, tuple[int, ...] | None]
    share: bool
    errors: list[str]
    warnings: list[str]
    recipe_path: str | None
    run_id: str | None
    overrides: list[str]


@dataclass
class Comparison:
    rows: list[dict[str, Any]]
    warnings: list[str]
    records: list[dict[str, Any]]
    source: str
    side_by_side: list[dict[str, Any]]  # runs without benchmark results: their latest metrics
    run_ids: list[str]


class Backend:
    """Blocking calls over one workspace; one SQLite connection per worker group.

    Workers of one group never overlap (the panes guarantee it), so a group's connection is used
    by one thread at a time even though successive workers run on different threads.
    """

    def __init__(self, workspace: str | os.PathLike, inventory: InventoryLike | None = None,
                 leases: GpuLeases | None = None, run_ids: Callable[[], str] | None = None) -> None:
        self.workspace = Path(workspace)
        self._inventory = inventory
        self._leases = leases
        self._run_ids = run_ids  # tests fix the ids that plans show
        self._logs: dict[str, RunLog] = {}
        self._lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------------
    def log(self, group: str = "default") -> RunLog:
        from adaflash.runlog import RunLog

        with self._lock:
            log = self._logs.get(group)
            if log is None:
                log = self._logs[group] = RunLog.open(self.workspace)
            return log

    @contextlib.contextmanager
    def fresh_log(self) -> Iterator[RunLog]:
        """A connection of its own, for rare actions that may run alongside each other (stops)."""
        from adaflash.runlog import RunLog

        log = RunLog.open(self.workspace)
        try:
            yield log
        finally:
            log.close()

    def close(self) -> None:
        """Drop the connections rather than close them: a pane's thread worker may still be inside a query
        when the app unmounts, and closing a connection another thread is using crashes SQLite. Each one
        closes when its last user lets go of it."""
        with self._lock:
            self._logs.clear()
        if self._inventory is not None and hasattr(self._inventory, "close"):
            self._inventory.close()

    # -- GPUs -----------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        from jobs.gpus import Inventory

        if self._inventory is None:
            self._inventory = Inventory(runlog=self.log("gpus"))
        if isinstance(self._inventory, Inventory):
            return self._inventory.snapshot(cpu_interval=None)
        return self._inventory.snapshot()

    def leases(self) -> GpuLeases:
        from jobs.assign import GpuLeases

        if self._leases is None:
            self._leases = GpuLeases()
        return self._leases

    # -- runs -----------------------------------------------------------------------------------
    def initial_run(self) -> str | None:
        """The run to show first: the newest live run, else the newest run."""
        from jobs.control import supervisor_pid

        log = self.log("default")
        for status in LIVE_RUN_STATUSES:
            rows = log.list_runs(status=status, limit=1)
            if rows and supervisor_pid(rows[0]) is not None:
                return rows[0]["id"]
        rows = log.list_runs(limit=1)
        return rows[0]["id"] if rows else None

    def run_state(self, run_id: str | None, group: str = "jobs") -> RunState:
        from jobs.control import supervisor_pid

        if not run_id:
            return RunState(None, [], [], False, False)
        log = self.log(group)
        try:
            run = log.get_run(run_id)
        except KeyError:
            return RunState(None, [], [], False, False)
        jobs = log.jobs(run["id"])
        children = log.child_runs(run, jobs)
        lost = [r for r in [run, *children] if r["status"] in LIVE_RUN_STATUSES
                and r.get("pid_start_time") is not None and supervisor_pid(r) is None]
        if lost and log.reap_lost_runs():  # killed without recording their end: failed now, not "running" forever
            return self.run_state(run["id"], group)
        for child in children:
            child["jobs"] = log.jobs(child["id"])
        for job in jobs:
            job["url"] = service_url(run, job["name"])
        alive = supervisor_pid(run) is not None
        return RunState(run, jobs, children, alive, run["status"] in LIVE_RUN_STATUSES and alive)

    def run_statuses(self, run_ids: list[str], group: str = "default") -> dict[str, tuple[str, str | None]]:
        """(status, note) of each run (a run not in the log is left out); a lost run reads failed."""
        from jobs.control import supervisor_pid

        log = self.log(group)
        out = {}
        for run_id in run_ids:
            with contextlib.suppress(KeyError):
                run = log.get_run(run_id)
                if (run["status"] in LIVE_RUN_STATUSES and run.get("pid_start_time") is not None
                        and supervisor_pid(run) is None and log.reap_lost_runs()):
                    run = log.get_run(run_id)
                out[run_id] = (run["status"], run.get("note"))
        return out

    def live_runs(self, run_ids: list[str]) -> list[dict[str, Any]]:
        """Which of these runs still run (recorded live and supervised by a live process)."""
        from jobs.control import supervisor_pid

        log = self.log("quit")
        out = []
        for run_id in run_ids:
            with contextlib.suppress(KeyError):
                run = log.get_run(run_id)
                if run["status"] in LIVE_RUN_STATUSES and supervisor_pid(run) is not None:
                    out.append(run)
        return out

    def runs(self, *, method: str | None = None, target: str | None = None, dataset: str | None = None,
             status: str | None = None, kind: str | None = None, text: str | None = None,
             limit: int = HISTORY_LIMIT) -> list[dict[str, Any]]:
        log = self.log("history")
        log.reap_lost_runs()  # a run killed without recording its end shows as failed, not running forever
        return log.list_runs(method=method, target=target, dataset=dataset, status=status, kind=kind, text=text,
                             limit=limit)

    def run_index(self, **filters: str | None) -> RunIndex:
        """What History shows: the newest runs matching the filters (searched in the whole log), how many
        match in all, and every value each filter can take."""
        log = self.log("history")
        runs = self.runs(**filters)
        total = len(runs) if len(runs) < HISTORY_LIMIT else log.count_runs(**filters)
        return RunIndex(runs, total, {name: tuple(log.run_values(name)) for name in RUN_FILTERS})

    # -- job control -------------------------------------------------------------------------------
    def job_action(self, run_id: str, action: str, job: str | None) -> str:
        """Stop/restart a job or stop the run; returns what was done, for a notification."""
        with self.fresh_log() as log:
            return self._job_action(log, run_id, action, job)

    def _job_action(self, log: RunLog, run_id: str, action: str, job: str | None) -> str:
        from jobs.control import request_job_action, supervisor_pid

        run = log.get_run(run_id)
        alive = supervisor_pid(run) is not None
        if action == "stop-run":
            return self._stop_run(log, run["id"])
        if not alive or not run.get("run_dir"):
            raise RuntimeError(f"run {run['id']} has no live supervisor to {action} job {job}; "
                               "stop the run instead (x)")
        request_job_action(run["run_dir"], action, job)
        return f"{action} of job {job} requested"

    pipeline_stop_wait = PIPELINE_STOP_WAIT

    def _stop_run(self, log: RunLog, run_id: str) -> str:
        """Stop a run the way `adaflash pipeline stop` stops a pipeline, then the rest as `runs stop` does.

        Each live pipeline in the run (the run itself, or one its jobs started) is asked to stop through its
        swap dir: both workers finish the step in flight, a final version is published and the pipeline
        records its end. Only then is whatever still runs stopped with signals. Whichever way it went, what the
        user stopped reads `stopped` (a server stopped by signal does too), its note saying how it ended.
        """
        from adaflash.pipeline.buffer import SwapBuffer
        from jobs.control import stop_run

        run = log.get_run(run_id)
        asked = time.time()
        pipelines = [r for r in [run, *log.child_runs(run)] if r.get("kind") == "pipeline"
                     and r["status"] in LIVE_RUN_STATUSES and (r.get("config") or {}).get("swap_dir")]
        for pipeline in pipelines:
            SwapBuffer(pipeline["config"]["swap_dir"]).request_stop()
            log.log_event(pipeline["id"], "stop requested by the user (adaflash-tui): finishing the step in flight")
        ended = self._wait_ended(log, [p["id"] for p in pipelines], self.pipeline_stop_wait)
        if pipelines and run["id"] not in ended:
            self._wait_ended(log, [run["id"]], 15.0)  # its supervisor records the end of its last job
        current = log.get_run(run["id"])
        if current["status"] in LIVE_RUN_STATUSES:
            result = stop_run(log, run["id"], grace=5.0)
            return f"run {result.run_id} {result.status} ({result.how})"
        how = (log.get_run(ended[0])["note"] or "") if ended else ""
        how = how.removeprefix("stopped on request: ") or "the pipeline finished its step"
        for rid in dict.fromkeys([*ended, *([run["id"]] if pipelines else [])]):
            if log.get_run(rid)["status"] == "finished":  # it honoured the request: stopped, cleanly
                log.update_run(rid, status="stopped", note=f"stopped by the user: {how}")
                for job in log.jobs(rid):
                    if job["status"] == "finished" and (job.get("ended_at") or 0) >= asked:
                        log.update_job(job["id"], status="stopped", message=f"stopped by the user: {how}")
        current = log.get_run(run["id"])
        return f"run {run['id']} {current['status']}" + (f", {current['note']}" if current.get("note") else "")

    @staticmethod
    def _wait_ended(log: RunLog, run_ids: list[str], timeout: float) -> list[str]:
        """Until each run records its end (or its process is gone, then it is reaped); returns those ended."""
        from jobs.control import supervisor_pid

        deadline = time.monotonic() + timeout
        pending = list(run_ids)
        while pending and time.monotonic() < deadline:
            for rid in list(pending):
                run = log.get_run(rid)
                if run["status"] not in LIVE_RUN_STATUSES:
                    pending.remove(rid)
                elif run.get("pid_start_time") is not None and supervisor_pid(run) is None:
                    log.reap_lost_runs()
            if pending:
                time.sleep(0.2)
        return [rid for rid in run_ids if rid not in pending]

    def stop_runs(self, run_ids: list[str]) -> list[str]:
        done = []
        with self.fresh_log() as log:
            for run_id in run_ids:
                with contextlib.suppress(KeyError):
                    done.append(self._stop_run(log, run_id))
        return done

    # -- logs -----------------------------------------------------------------------------------
    @staticmethod
    def read_log(path: str | None, offset: int) -> LogChunk:
        """New bytes of a job log since `offset` (a first read starts at the tail)."""
        if not path:
            return LogChunk(path, 0, "", True)
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                reset = offset <= 0 or size < offset
                start = max(0, size - LOG_TAIL_BYTES) if reset else offset
                handle.seek(start)
                data = handle.read(max(0, size - start))
        except OSError:
            return LogChunk(path, 0, "", offset <= 0)
        text = data.decode(errors="replace")
        if reset and start > 0 and "\n" in text:
            text = text.split("\n", 1)[1]  # drop the partial first line of a tail
        return LogChunk(path, start + len(data), text, reset)

    # -- metrics --------------------------------------------------------------------------------
    def metrics(self, run_id: str, cursors: dict[str, int], page: int = METRICS_PAGE) -> MetricsBatch:
        """Rows newer than each cursor, for the run and the runs its jobs created."""
        log = self.log("monitor")
        run = log.get_run(run_id)
        sources = {run["id"]: ""}
        statuses = {run["id"]: run["status"]}
        for child in log.child_runs(run):
            sources[child["id"]] = source_label(child)
            statuses[child["id"]] = child["status"]
        rows, more = {}, False
        for rid in sources:
            batch = log.metrics_since(cursors.get(rid, 0), run_id=rid, limit=page)
            more = more or len(batch) >= page
            rows[rid] = batch
        return MetricsBatch(run["id"], sources, rows, more, statuses)

    # -- launch ---------------------------------------------------------------------------------
    def recipes(self) -> list[tuple[str, str]]:
        """(label, path) of the shipped recipes and of the workspace's recipes/ folder."""
        from jobs.recipe import shipped_recipes

        out = [(p.stem, str(p)) for p in shipped_recipes()]
        folder = self.workspace / RECIPES_DIR
        if folder.is_dir():
            out += [(f"{p.stem} (workspace)", str(p)) for p in sorted(folder.glob("*.toml"))
                    if not p.name.startswith("tui-")]
        return out

    def plan(self, recipe_path: str | os.PathLike, overrides: list[str], snapshot: Snapshot | None,
             *, recipe_text: str | None = None, run_id: str | None = None,
             warnings: list[str] | None = None) -> LaunchPlan:
        """Validate a recipe (written first when `recipe_text` is given) with these overrides."""
        from jobs.plan import prepare
        from jobs.recipe import RecipeError

        if recipe_text is not None:
            write_text(Path(recipe_path), recipe_text)
        errors: list[str] = []
        try:
            prepared = prepare(recipe_path, overrides, workspace=self.workspace,
                                      run_id=run_id or (self._run_ids() if self._run_ids else None))
        except RecipeError as err:
            errors = [p.render(Path(err.path).name) for p in err.problems]
            return LaunchPlan(None, {}, False, errors, list(warnings or []), str(recipe_path), None, overrides)
        except (ValueError, OSError) as err:
            return LaunchPlan(None, {}, False, [str(err)], list(warnings or []), str(recipe_path), None, overrides)
        recipe = prepared.recipe
        if snapshot is not None:
            errors += recipe.gpu_errors(snapshot)
        warns = list(warnings or [])
        gpus = sorted(recipe.gpus_in_use())
        if gpus:
            with contextlib.suppress(Exception):
                for lease in self.leases().active():
                    taken = sorted(set(lease.gpus) & set(gpus))
                    if taken:
                        errors.append(f"GPU {', '.join(map(str, taken))} in use by run {lease.run_id} "
                                      f"(pid {lease.pid})")
        roles = {name: role.gpus for name, role in recipe.assignment.roles.items()}
        return LaunchPlan(prepared.plan_text(), roles, recipe.assignment.share, errors, warns, str(recipe_path), prepared.run_id, overrides)

    @staticmethod
    def port_problem(port: int, host: str = "127.0.0.1") -> str | None:
        """Why a server cannot listen on the port (another process holds it), else None."""
        from jobs.ports import port_problem

        return port_problem(host, port)

    def relaunch(self, run_id: str) -> Relaunch:
        """How to launch a past run again, from what the run log recorded (NotRelaunchable says why not)."""
        from jobs.rerun import relaunch_of

        with self.fresh_log() as log:
            return relaunch_of(log.get_run(run_id))

    def rerun(self, relaunch: Relaunch, snapshot: Snapshot | None) -> str:
        """Launch a past run again, detached, the way the Launch form would; returns the new run id."""
        from jobs.rerun import relaunch_built

        gpus = [g.index for g in snapshot.gpus] if snapshot is not None and snapshot.available else []
        built = relaunch_built(relaunch, self.workspace / RECIPES_DIR, self.workspace, gpus,
                               f"rerun-{time.strftime('%Y%m%d-%H%M%S')}")
        if built.errors or built.recipe_path is None:
            raise ValueError("; ".join(built.errors) or "nothing to launch")
        return self.launch(built.recipe_path, built.overrides, snapshot, recipe_text=built.recipe_text)

    def launch(self, recipe_path: str | os.PathLike, overrides: list[str], snapshot: Snapshot | None,
               *, recipe_text: str | None = None, run_id: str | None = None) -> str:
        """Start the run detached (its supervisor outlives the TUI); returns the run id.

        `run_id`: the one the plan showed, so the started command lines are exactly those shown.
        """
        from jobs.detached import start_detached
        from jobs.plan import prepare

        if recipe_text is not None:
            write_text(Path(recipe_path), recipe_text)
        prepared = prepare(recipe_path, overrides, workspace=self.workspace, run_id=run_id)
        with self.fresh_log() as log:
            return start_detached(prepared, log, inventory=snapshot)

    # -- compare --------------------------------------------------------------------------------
    def comparison(self, run_ids: list[str] | None) -> Comparison:
        from adaflash.bench import compare

        log = self.log("compare")
        records, source = compare.select_records(log, run_ids or None)
        rows, warnings = compare.comparison_rows(records)
        side = []
        if run_ids and not records:  # neither the runs nor the runs their jobs created benchmarked anything
            side = [{"run": run, "metrics": log.last_metrics(run["id"])} for run in map(log.get_run, run_ids)]
        return Comparison(rows, warnings, records, source, side, list(run_ids or []))

    def export(self, rows: list[dict[str, Any]], warnings: list[str], fmt: str) -> Path:
        """The comparison table as shown (filtered, sorted) into <workspace>/exports/."""
        from adaflash.bench import compare

        if fmt == "markdown":
            return self._export_file("compare", "md", compare.markdown_table(rows, warnings))
        if fmt == "csv":
            return self._export_file("compare", "csv", rows_csv(rows))
        raise ValueError(f"unknown export format {fmt!r}")

    def export_metrics(self, side: list[dict[str, Any]], fmt: str) -> Path:
        """Runs without benchmark results, their latest metrics side by side (metric × run), as shown."""
        runs = [item["run"]["id"] for item in side]
        names = sorted({name for item in side for name in item["metrics"]})
        table = [[name, *(item["metrics"].get(name) for item in side)] for name in names]
        if fmt == "markdown":
            lines = ["| metric | " + " | ".join(runs) + " |", "|---" * (len(runs) + 1) + "|"]
            lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in table]
            return self._export_file("metrics", "md", "\n".join(lines) + "\n")
        if fmt == "csv":
            import csv
            import io

            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\n")
            writer.writerows([["metric", *runs], *table])
            return self._export_file("metrics", "csv", buffer.getvalue())
        raise ValueError(f"unknown export format {fmt!r}")

    # -- query (read-only SQL over the run log) --------------------------------------------------------
    @property
    def runlog_path(self) -> Path:
        from adaflash.workspace import RUNLOG_FILE

        return self.workspace / RUNLOG_FILE

    def query_sources(self) -> list[Source]:
        from tui.sqlquery import sources

        return sources(self.runlog_path)

    def query(self, sql: str) -> QueryResult:
        from tui.sqlquery import run_query

        return run_query(self.runlog_path, sql)

    def export_query(self, result: QueryResult, fmt: str) -> Path:
        """The query's rows as shown into <workspace>/exports/query-*.csv or .md."""
        from tui.sqlquery import to_csv, to_markdown

        if fmt not in ("csv", "markdown"):
            raise ValueError(f"unknown export format {fmt!r}")
        text = to_csv(result) if fmt == "csv" else to_markdown(result)
        return self._export_file("query", "csv" if fmt == "csv" else "md", text)

    def _export_file(self, stem: str, suffix: str, text: str) -> Path:
        path = unique_path(self.workspace / EXPORTS_DIR / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.{suffix}")
        write_text(path, text)
        return path


def service_url(run: dict[str, Any], job: str) -> str | None:
    """Where a recipe's service job answers: its readiness URL less the path (http://127.0.0.1:30000)."""
    from urllib.parse import urlsplit

    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    spec = (config.get("jobs") or {}).get(job) or {}
    http = (spec.get("ready") or {}).get("http") if isinstance(spec, dict) else None
    if not http:
        return None
    parts = urlsplit(http)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


def source_label(child: dict[str, Any]) -> str:
    """How the Monitor names a run its run's jobs created: the job, and the run's method when it has one, so
    the servers of a benchmark matrix (one job, one run per method) are one series per method."""
    return "/".join(part for part in (child.get("job"), child.get("method")) if part)


def rows_csv(rows: list[dict[str, Any]]) -> str:
    """Comparison rows as CSV with the comparison's own column names (raw numbers, not formatted)."""
    import csv
    import io

    from adaflash.bench import compare

    columns = ["group", "run_id", *compare.columns_for(rows), "fair"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue()


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def unique_path(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        n += 1
    return candidate


def is_active(job: dict[str, Any]) -> bool:
    return job.get("status") in ACTIVE_JOB_STATUSES


__all__ = ["Backend", "Comparison", "LaunchPlan", "LogChunk", "MetricsBatch", "RunState", "is_active"]
