"""`adaflash bench`: measure a running SGLang-dialect server; `bench matrix`, `bench engine`, `bench cost` and
`bench shift` are its subcommands (their own modules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import fail, recorded_run, runlog_of, workspace_of
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.resolve import warmup_count
from adaflash.options import BenchConfig, InputConfig, ModelConfig, SamplingConfig, ServeConfig

SUMMARY = [("completed", "Successful requests"), ("duration", "Benchmark duration (s)"),
           ("total_input_tokens", "Total input tokens"), ("total_output_tokens", "Total generated tokens"),
           ("request_throughput", "Request throughput (req/s)"), ("output_throughput", "Output token throughput (tok/s)"),
           ("total_throughput", "Total token throughput (tok/s)"), ("accept_length", "Accept length (τ)"),
           ("accept_rate", "Accept rate"), ("median_ttft_ms", "Median TTFT (ms)"), ("p99_ttft_ms", "P99 TTFT (ms)"),
           ("median_tpot_ms", "Median TPOT (ms)"), ("median_itl_ms", "Median ITL (ms)"), ("p99_itl_ms", "P99 ITL (ms)"),
           ("median_e2e_latency_ms", "Median E2E latency (ms)"), ("accuracy", "Accuracy")]


def _server_info(base_url: str, api_key: str | None, api: str = "generate") -> dict[str, Any]:
    import urllib.error
    import urllib.request

    from adaflash.bench.client import info_path, server_info

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    path = info_path(api)
    try:
        request = urllib.request.Request(base_url + path, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as err:
        fail(f"{base_url}{path} answered HTTP {err.code}" + (" (wrong or missing --api-key?)" if err.code == 401 else
                                                             " (an OpenAI-only server? --api openai)" if err.code == 404 else ""))
    except (urllib.error.URLError, OSError, ValueError) as err:
        fail(f"cannot reach the server at {base_url} ({err}); start one with `adaflash serve`")
    return server_info(data if isinstance(data, dict) else None, api)


def _prompts(ctx: click.Context, dataset: str, num_prompts: int, seed: int | None, chat: bool, target: str | None):
    """(dataset name, rendered prompts) or a clean error."""
    from adaflash.bench.prompts import BenchDataError, load_rows

    try:
        name, rows = load_rows(dataset, workspace_of(ctx), num_prompts, seed)
    except BenchDataError as err:
        fail(str(err))
    from collections import Counter

    for domain, count in Counter(row.domain for row in rows).items():
        if count < num_prompts:
            where = f"{name}/{domain}" if domain else name
            click.secho(f"note: {where} holds {count} prompts, fewer than --num-prompts {num_prompts}; using them all",
                        fg="yellow", err=True)
    return name, render_prompts(rows, chat, target)


def render_prompts(rows: list, chat: bool, target: str | None) -> list:
    """The exact texts the server gets: the target's chat template (--chat) or the prompts as they are."""
    from adaflash.bench.prompts import PromptRenderer, raw_prompts

    if not chat:
        return raw_prompts(rows)
    if not target:
        fail("cannot apply the chat template without a target: give --target (or --no-chat)")
    try:
        renderer = PromptRenderer(target, chat=True)
    except (OSError, ValueError) as err:
        fail(f"cannot load the tokenizer of {target} ({err}); give --target or --no-chat")
    return [renderer.render(row) for row in rows]


class _Progress:
    """A rich progress bar on stderr, one task per measured cell."""

    def __init__(self, enabled: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("ok {task.fields[ok]} · failed {task.fields[bad]}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), disable=not enabled)
        self.task = None

    def __enter__(self) -> _Progress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def new(self, description: str, total: int) -> None:
        self.task = self.progress.add_task(description, total=total, ok=0, bad=0)

    def done(self, result) -> None:
        if self.task is None:
            return
        fields = self.progress.tasks[self.task].fields
        key = "ok" if result.success else "bad"
        self.progress.update(self.task, advance=1, **{key: fields[key] + 1})

    def log(self, message: str) -> None:
        self.progress.console.print(message)


@click.group(invoke_without_command=True)
@uses(use(ServeConfig, only=("base_url", "api_key")), use(InputConfig, only=("dataset", "num_prompts")),
      use(SamplingConfig, only=("max_new_tokens", "temperature", "top_p", "chat", "seed")),
      use(BenchConfig, only=("concurrency", "warmup", "eval_accuracy", "label", "stream", "ignore_eos", "api",
                             "length_spread")),
      use(ModelConfig, only=("method", "target", "draft"), notes={"method": "Metadata [default: from /get_server_info].",
                                                                 "draft": "Metadata [default: from /get_server_info]."}),
      Output(("table", "json"), help="table, or json: the recorded result."), command="bench")
@click.pass_context
def bench(ctx: click.Context, serve: ServeConfig, inputs: InputConfig, sampling: SamplingConfig, bench: BenchConfig,
          model: ModelConfig, output: str) -> None:
    """Benchmark a running server with SGLang bench_serving's metrics; the result goes to the run log.

    `adaflash bench matrix ...` instead serves every method in turn and measures each one;
    `adaflash bench engine ...` measures them in this process through the embedded engine;
    `adaflash bench cost ...` times the target's verify pass by width and batch.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not serve.url or not inputs.dataset:
        click.echo(ctx.get_help())
        fail("give --base-url URL and --dataset NAME|FILE.jsonl")
    from adaflash.bench.client import BenchSettings

    concurrency = one_level(bench)
    info = _server_info(serve.url, serve.api_key, bench.api)
    meta = _metadata(model, info)
    name, prompts = _prompts(ctx, inputs.dataset, inputs.num_prompts, sampling.seed, sampling.chat, meta["target"])
    settings = BenchSettings(serve.url, concurrency=concurrency, max_new_tokens=sampling.max_new_tokens,
                             length_spread=bench.length_spread,
                             temperature=sampling.temperature, top_p=sampling.top_p, warmup=warmup_count(bench),
                             stream=bench.stream, ignore_eos=bench.ignore_eos, api_key=serve.api_key, api=bench.api,
                             model=info.get("model_path") if bench.api == "openai" else None)
    run_id, record = _measure(ctx, settings, prompts, name, meta, bench, sampling, output == "json")
    if output == "json":
        click.echo(json.dumps({"run_id": run_id, **record}, indent=2, default=str))
    else:
        _print_summary(run_id, record)
    if not record["completed"]:
        fail(f"every request failed: {record['errors'][:1]}", code=1)


def one_level(bench: BenchConfig) -> int:
    """The one --concurrency of a command that measures one (bench matrix takes several)."""
    levels = bench.levels
    if len(levels) != 1:
        fail(f"--concurrency takes one level here, got {bench.concurrency!r} (bench matrix takes several)")
    return levels[0]


def _metadata(model: ModelConfig, info: dict[str, Any]) -> dict[str, Any]:
    """Method, target and drafter: as given, else as the server reports them."""
    from adaflash.bench.client import method_from_info

    if len(model.method) > 1 or len(model.draft) > 1:
        fail("--method and --draft are given once here (metadata of the one server measured)")
    return {"method": model.method[0] if model.method else method_from_info(info),
            "target": model.target or info.get("target") or info.get("model_path"),
            "draft": model.draft[0] if model.draft else info.get("draft") or info.get("speculative_draft_model_path")}


def _measure(ctx: click.Context, settings: Any, prompts: list, name: str, meta: dict[str, Any], bench: BenchConfig,
             sampling: SamplingConfig, quiet: bool) -> tuple[str, dict[str, Any]]:
    """Run the benchmark inside a recorded run: (run id, the record)."""
    from adaflash.bench.client import run_benchmark

    log = runlog_of(ctx)
    c = settings.concurrency
    config = {"base_url": settings.base_url, "concurrency": c, "num_prompts": len(prompts),
              "max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature, "chat": sampling.chat,
              "warmup": settings.warmup, "seed": sampling.seed}
    with recorded_run(log, "bench", name=bench.label or f"bench-{meta['method']}-{name}-c{c}", dataset=name,
                      config=config, **meta) as run:
        with _Progress(not quiet) as progress:
            progress.new(f"{meta['method']} · {name} · c={c}", len(prompts))
            record = run_benchmark(settings, prompts, dataset=name, on_done=progress.done, label=bench.label,
                                   eval_accuracy=bench.eval_accuracy,
                                   extra={"chat": sampling.chat, "seed": sampling.seed}, **meta)
        log.add_bench_result(run.id, record)
        run.metrics({k: record[k] for k in ("output_throughput", "accept_length", "median_ttft_ms", "accuracy")
                     if record.get(k) is not None})
        if not record["completed"]:
            run.finish("failed", note="; ".join(record["errors"][:2]))
    return run.id, record


def _print_summary(run_id: str, record: dict[str, Any]) -> None:
    from adaflash.cli.common import emit_rows, fmt_cell

    rows = [{"metric": title, "value": fmt_cell(record.get(key))} for key, title in SUMMARY]
    emit_rows(rows, ["metric", "value"], "table",
              title=f"{record['method']} · {record['dataset']} · concurrency {record['concurrency']} [{run_id}]")
    loop = record.get("engine_loop") or {}
    if loop.get("steps"):  # our server: where its engine's time went over the measured requests
        from adaflash.bench.metrics import passes_text

        passes = passes_text(record.get("passes") or {})
        click.echo(f"server engine: {loop['steps']:,} steps, {loop['rows_per_step']:.1f} rows a step, "
                   f"{loop['step_ms']:.2f} ms a step, {loop['between_ms']:.2f} ms between steps; passes: {passes}")
    if record.get("failed"):
        click.secho(f"{record['failed']} request(s) failed, e.g. {record['errors'][:1]}", fg="yellow", err=True)


def split(text: str, what: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        fail(f"{what} is empty")
    return items


def suite_overall(log, matrix_id: str, suites: dict[str, list[str]]) -> None:
    """A suite's overall rows (means over its domains) beside the matrix's per-domain results."""
    from adaflash.bench.compare import overall_records, select_records

    records, _ = select_records(log, [matrix_id])
    for suite, domains in suites.items():
        tagged = [{**r, "domain": str(r["dataset"]).split("/", 1)[1]} for r in records
                  if str(r.get("dataset", "")).startswith(suite + "/")]
        for record in overall_records(tagged, suite, domains):
            record["matrix_run"] = matrix_id
            log.add_bench_result(matrix_id, record)


def supervised_launcher(log, workspace: str, spec):
    """Servers started through jobs.supervisor: a jobs row per server, readiness and group stops verified."""
    import time

    from adaflash.devices import parse_gpus
    from jobs.recipe_spec import JobSpec, ReadyCheck
    from jobs.supervisor import TERMINAL, Supervisor

    supervisors: dict[str, Supervisor] = {}
    gpu_ids = parse_gpus(spec.gpus, owner="--gpus") if spec.gpus else None

    class Supervised:
        def __init__(self, name: str, argv: list[str], run_id: str, run_dir: Path, url: str) -> None:
            self.sup = supervisors.setdefault(run_id, Supervisor(log, run_id, run_dir, workspace=workspace))
            self.name = name
            # No --gpus: leave CUDA_VISIBLE_DEVICES alone (launcher=True) so the server sees every GPU.
            self.spec = JobSpec(name=name, command=argv, kind="service", role="serve",
                                gpu_roles={"serve": gpu_ids} if gpu_ids else {}, launcher=not gpu_ids,
                                ready=ReadyCheck(http=url + "/health", timeout=spec.ready_timeout, interval=0.5),
                                stop_grace=spec.grace, description=f"bench matrix server {name}")

        def start(self) -> None:
            self.sup.add(self.spec)
            state = self.sup.start(self.name)
            if state.status == "failed":
                raise RuntimeError(state.message or f"{self.name} could not start")

        def wait_ready(self, _url: str, timeout: float) -> None:
            deadline = time.monotonic() + timeout + 5
            while time.monotonic() < deadline:
                self.sup.poll()
                state = self.sup.jobs[self.name]
                if state.status == "ready":
                    return
                if state.status in TERMINAL or state.status == "restarting":
                    raise RuntimeError(state.message or f"{self.name} ended ({state.status})")
                time.sleep(0.2)
            raise RuntimeError(f"{self.name} was not ready within {timeout:.0f} s")

        def stop(self, grace: float) -> int | None:
            self.sup.stop(self.name, grace=grace, why="benchmark done")
            return self.sup.jobs[self.name].exit_code

    return Supervised


def _add_subcommands() -> None:
    from adaflash.cli.bench_cost import cost
    from adaflash.cli.bench_engine import engine
    from adaflash.cli.bench_matrix import matrix
    from adaflash.cli.bench_shift import shift

    for command in (matrix, engine, shift, cost):
        bench.add_command(command)


_add_subcommands()
