"""A benchmark matrix: every method served in turn, every dataset × concurrency measured against it.

Each server is `adaflash serve ...` started with `adaflash.procs.spawn` (its own process group,
SIGTERM if this process dies, stopped with SIGTERM, then SIGKILL after a grace period); the client
runs in this process. One parent run (kind "bench-matrix")
groups the child "bench" runs, and every record carries `matrix_run`, so `adaflash runs compare
MATRIX_RUN` finds the whole comparison. The prompts are rendered once, before any server starts, so
every method sees exactly the same text.

The core never imports `jobs`, so the default launcher here runs the server itself; the CLI passes a
`launcher` factory built on `jobs.supervisor` (jobs rows and events in the run log). Both start and
stop through `adaflash.procs`. Any object with start / wait_ready / stop will do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from adaflash import procs
from adaflash.bench.client import BenchSettings, run_benchmark
from adaflash.bench.metrics import RequestResult
from adaflash.bench.prompts import BenchPrompt
from adaflash.devices import parse_gpus


@dataclass
class MatrixSpec:
    methods: list[str]
    datasets: list[str]
    concurrency: list[int]
    target: str
    drafts: dict[str, str] = field(default_factory=dict)
    num_prompts: int = 16
    max_new_tokens: int = 256
    length_spread: float = 0.0
    temperature: float = 0.0
    top_p: float = 1.0
    warmup: int = 1
    eval_accuracy: bool = False
    label: str | None = None
    engine: str = "embedded"
    gpus: str | None = None
    host: str = "127.0.0.1"
    context_length: int | None = None
    serve_args: list[str] = field(default_factory=list)
    ready_timeout: float = 900.0
    grace: float = 15.0
    # The servers inherit ADAFLASH_API_KEY from the environment; the client sends the same key.
    # Never part of argv or of the recorded config.
    api_key: str | None = field(default=None, repr=False)

    def config(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "api_key"}


class Launcher(Protocol):
    def start(self) -> None: ...
    def wait_ready(self, url: str, timeout: float) -> None: ...
    def stop(self, grace: float) -> int | None: ...


class ServerProcess:
    """A server subprocess in its own process group, its output in a log file."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log_path = Path(log_path)
        self.env = env
        self.group: procs.ProcessGroup | None = None

    def start(self) -> None:
        self.group = procs.spawn(self.argv, log=self.log_path, env={**os.environ, **(self.env or {})})

    def wait_ready(self, url: str, timeout: float) -> None:
        """Until GET /health answers 200; RuntimeError (with the log's tail) if the process dies or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.group is None or self.group.poll() is not None:
                code = None if self.group is None else self.group.returncode
                raise RuntimeError(f"the server exited (code {code}) before it was ready:\n{self.tail()}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the server was not ready within {timeout:.0f} s:\n{self.tail()}")

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM to the whole group, SIGKILL after `grace` seconds; the exit code."""
        if self.group is None:
            return None
        self.group.stop(grace)
        return self.group.returncode

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


# (job name, argv, matrix run id, run folder, server URL) -> a Launcher
LauncherFactory = Callable[[str, list[str], str, Path, str], Launcher]


def local_launcher(name: str, argv: list[str], run_id: str, run_dir: Path, _url: str) -> ServerProcess:
    """A server whose run the log records under the matrix run (as the jobs runner does for its jobs)."""
    return ServerProcess(argv, run_dir / f"{name}.log", env={"ADAFLASH_RUN_ID": run_id, "ADAFLASH_JOB": name})


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def serve_argv(spec: MatrixSpec, method: str, port: int, workspace: str | Path) -> list[str]:
    argv = [sys.executable, "-m", "adaflash.cli.main", "--workspace", str(workspace), "serve", "--method", method,
            "--target", spec.target, "--host", spec.host, "--port", str(port), "--engine", spec.engine,
            "--max-batch", str(max(spec.concurrency))]
    if method in spec.drafts:
        argv += ["--draft", spec.drafts[method]]
    if spec.gpus:  # the server's CUDA_VISIBLE_DEVICES holds exactly these GPUs: to it they are 0..n-1
        count = len(parse_gpus(spec.gpus, owner="--gpus") or ())
        argv += ["--gpus", ",".join(str(i) for i in range(count)) if count else "cpu"]
    if spec.context_length and spec.engine == "embedded":
        argv += ["--context-length", str(spec.context_length)]
    return argv + list(spec.serve_args)


@dataclass
class MatrixEvents:
    """Callbacks for a progress display; all optional."""

    cell: Callable[[str, str, int, int], None] | None = None          # method, dataset, concurrency, prompts
    request: Callable[[RequestResult], None] | None = None
    message: Callable[[str], None] | None = None


def run_matrix(
    spec: MatrixSpec,
    log: Any,
    workspace: str | Path,
    prompts: dict[str, list[BenchPrompt]],
    *,
    events: MatrixEvents | None = None,
    launcher: LauncherFactory | None = None,
) -> str:
    """Run the whole matrix; returns the bench-matrix run id (results recorded as they come)."""
    events = events or MatrixEvents()
    say = events.message or (lambda _m: None)
    matrix_id = log.create_run("bench-matrix", name=spec.label or "bench-matrix", target=spec.target,
                               dataset=",".join(spec.datasets), config=spec.config())
    run_dir = Path(workspace) / "runs" / matrix_id
    recorded = failed_methods = 0
    try:
        for method in spec.methods:
            port = free_port(spec.host)
            url = f"http://{spec.host}:{port}"
            argv = serve_argv(spec, method, port, workspace)
            server = (launcher or local_launcher)(f"serve-{method}", argv, matrix_id, run_dir, url)
            log.log_event(matrix_id, f"starting {method}: {' '.join(argv)}")
            say(f"starting the {method} server on {url}")
            try:
                server.start()
                server.wait_ready(url, spec.ready_timeout)
            except (RuntimeError, OSError) as err:
                failed_methods += 1
                log.log_event(matrix_id, f"{method}: server failed: {err}", level="error")
                say(f"{method}: the server failed to start, skipping it\n{err}")
                server.stop(spec.grace)
                continue
            try:
                for dataset in spec.datasets:
                    for concurrency in spec.concurrency:
                        recorded += _run_cell(spec, log, matrix_id, method, dataset, concurrency, url,
                                              prompts[dataset], events)
            finally:
                code = server.stop(spec.grace)
                log.log_event(matrix_id, f"{method}: server stopped (exit code {code})")
    except BaseException as err:
        log.finish_run(matrix_id, "stopped" if isinstance(err, KeyboardInterrupt) else "failed",
                       note=f"{type(err).__name__}: {err}")
        raise
    expected = len(spec.methods) * len(spec.datasets) * len(spec.concurrency)
    note = f"{recorded}/{expected} results" + (f"; {failed_methods} server(s) failed" if failed_methods else "")
    log.finish_run(matrix_id, "finished" if recorded else "failed", note=note)
    return matrix_id


def _run_cell(spec: MatrixSpec, log: Any, matrix_id: str, method: str, dataset: str, concurrency: int, url: str,
              prompts: list[BenchPrompt], events: MatrixEvents) -> int:
    if events.cell:
        events.cell(method, dataset, concurrency, len(prompts))
    draft = spec.drafts.get(method)
    run_id = log.create_run("bench", name=f"bench-{method}-{dataset}-c{concurrency}", method=method,
                            target=spec.target, draft=draft, dataset=dataset, parent_id=matrix_id,
                            config={"matrix_run": matrix_id, "base_url": url, "concurrency": concurrency})
    settings = BenchSettings(url, concurrency=concurrency, max_new_tokens=spec.max_new_tokens,
                             temperature=spec.temperature, top_p=spec.top_p, warmup=spec.warmup,
                             api_key=spec.api_key, length_spread=spec.length_spread)
    try:
        record = run_benchmark(settings, prompts, dataset=dataset, on_done=events.request, method=method,
                               target=spec.target, draft=draft, label=spec.label, eval_accuracy=spec.eval_accuracy,
                               extra={"matrix_run": matrix_id, "engine": spec.engine})
    except Exception as err:
        log.finish_run(run_id, "failed", note=f"{type(err).__name__}: {err}")
        log.log_event(matrix_id, f"{method}/{dataset}/c{concurrency}: client failed: {err}", level="error")
        return 0
    log.add_bench_result(run_id, record)
    log.log_metrics(run_id, {k: record[k] for k in ("output_throughput", "accept_length", "median_ttft_ms")
                             if record.get(k) is not None})
    log.finish_run(run_id, "finished" if record["completed"] else "failed")
    return 1
