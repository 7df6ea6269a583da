"""`adaflash bench`: measure a running SGLang-dialect server; `adaflash bench matrix`: every method in turn."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from adaflash.cli.bench_cost import cost
from adaflash.cli.bench_shift import shift
from adaflash.cli.common import DTYPE_HELP, fail, note_builtin_drafter, recorded_run, runlog_of, workspace_of
from adaflash.cli.engine_options import engine_options
from adaflash.engine.config import EngineConfig
from adaflash.methods import METHOD_NAMES, SPECULATIVE_NAMES, VANILLA, method_of

SUMMARY = [("completed", "Successful requests"), ("duration", "Benchmark duration (s)"),
           ("total_input_tokens", "Total input tokens"), ("total_output_tokens", "Total generated tokens"),
           ("request_throughput", "Request throughput (req/s)"), ("output_throughput", "Output token throughput (tok/s)"),
           ("total_throughput", "Total token throughput (tok/s)"), ("accept_length", "Accept length (τ)"),
           ("accept_rate", "Accept rate"), ("median_ttft_ms", "Median TTFT (ms)"), ("p99_ttft_ms", "P99 TTFT (ms)"),
           ("median_tpot_ms", "Median TPOT (ms)"), ("median_itl_ms", "Median ITL (ms)"), ("p99_itl_ms", "P99 ITL (ms)"),
           ("median_e2e_latency_ms", "Median E2E latency (ms)"), ("accuracy", "Accuracy")]


def _server_info(base_url: str, api_key: str | None) -> dict[str, Any]:
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        request = urllib.request.Request(base_url + "/get_server_info", headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as err:
        fail(f"{base_url}/get_server_info answered HTTP {err.code}" + (" (wrong or missing --api-key?)" if err.code == 401 else ""))
    except (urllib.error.URLError, OSError, ValueError) as err:
        fail(f"cannot reach the server at {base_url} ({err}); start one with `adaflash serve`")
    return data if isinstance(data, dict) else {}


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
@click.option("--base-url", default=None, help="Server URL, e.g. http://127.0.0.1:30000 (ours or SGLang).")
@click.option("--dataset", default=None,
              help="gsm8k, humaneval, mt-bench, sharegpt (the prepared <workspace>/data/NAME_test.jsonl) or FILE.jsonl.")
@click.option("--num-prompts", type=click.IntRange(1), default=64, show_default=True)
@click.option("--concurrency", type=click.IntRange(1), default=1, show_default=True, help="Requests in flight at most.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--temperature", type=click.FloatRange(0.0), default=0.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=1, show_default=True, help="Unmeasured requests sent first.")
@click.option("--eval-accuracy", is_flag=True, help="Score answers against the references (GSM8K: last number).")
@click.option("--label", default=None, help="A name for this result (shown in comparisons).")
@click.option("--chat/--no-chat", default=True, show_default=True,
              help="Apply the target's chat template client-side (the server gets the exact text).")
@click.option("--method", type=click.Choice(METHOD_NAMES), default=None, help="Metadata [default: from /get_server_info].")
@click.option("--target", default=None, help="Metadata and tokenizer [default: from /get_server_info].")
@click.option("--draft", default=None, help="Metadata [default: from /get_server_info].")
@click.option("--seed", type=int, default=None, help="Sample --num-prompts prompts with this seed (default: the first N).")
@click.option("--api-key", envvar="ADAFLASH_API_KEY", default=None, help="Bearer key of the server [env ADAFLASH_API_KEY].")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Stream answers (real TTFT and ITL).")
@click.option("--ignore-eos", is_flag=True, help="Always generate --max-new-tokens tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print the recorded result as JSON.")
@click.pass_context
def bench(ctx: click.Context, base_url: str | None, dataset: str | None, num_prompts: int, concurrency: int,
          max_new_tokens: int, temperature: float, top_p: float, warmup: int, eval_accuracy: bool, label: str | None,
          chat: bool, method: str | None, target: str | None, draft: str | None, seed: int | None,
          api_key: str | None, stream: bool, ignore_eos: bool, as_json: bool) -> None:
    """Benchmark a running server with SGLang bench_serving's metrics; the result goes to the run log.

    `adaflash bench matrix ...` instead serves every method in turn and measures each one;
    `adaflash bench engine ...` measures them in this process through the embedded engine;
    `adaflash bench cost ...` times the target's verify pass by width and batch.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not base_url or not dataset:
        click.echo(ctx.get_help())
        fail("give --base-url URL and --dataset NAME|FILE.jsonl")
    from adaflash.bench.client import BenchSettings, method_from_info, run_benchmark

    base_url = base_url.rstrip("/")
    info = _server_info(base_url, api_key)
    target = target or info.get("target") or info.get("model_path")
    name, prompts = _prompts(ctx, dataset, num_prompts, seed, chat, target)
    method = method or method_from_info(info)
    draft = draft if draft is not None else info.get("draft") or info.get("speculative_draft_model_path")
    settings = BenchSettings(base_url, concurrency=concurrency, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, warmup=warmup, stream=stream, ignore_eos=ignore_eos, api_key=api_key)
    log = runlog_of(ctx)
    config = {"base_url": base_url, "concurrency": concurrency, "num_prompts": len(prompts),
              "max_new_tokens": max_new_tokens, "temperature": temperature, "chat": chat, "warmup": warmup, "seed": seed}
    with recorded_run(log, "bench", name=label or f"bench-{method}-{name}-c{concurrency}", method=method,
                      target=target, draft=draft, dataset=name, config=config) as run:
        with _Progress(not as_json) as progress:
            progress.new(f"{method} · {name} · c={concurrency}", len(prompts))
            record = run_benchmark(settings, prompts, dataset=name, on_done=progress.done, method=method, target=target,
                                   draft=draft, label=label, eval_accuracy=eval_accuracy,
                                   extra={"chat": chat, "seed": seed})
        log.add_bench_result(run.id, record)
        run.metrics({k: record[k] for k in ("output_throughput", "accept_length", "median_ttft_ms", "accuracy")
                     if record.get(k) is not None})
        if not record["completed"]:
            run.finish("failed", note="; ".join(record["errors"][:2]))
    run_id = run.id
    if as_json:
        click.echo(json.dumps({"run_id": run_id, **record}, indent=2, default=str))
    else:
        _print_summary(run_id, record)
    if not record["completed"]:
        fail(f"every request failed: {record['errors'][:1]}", code=1)


def _print_summary(run_id: str, record: dict[str, Any]) -> None:
    from adaflash.cli.common import emit_rows, fmt_cell

    rows = [{"metric": title, "value": fmt_cell(record.get(key))} for key, title in SUMMARY]
    emit_rows(rows, ["metric", "value"], "table",
              title=f"{record['method']} · {record['dataset']} · concurrency {record['concurrency']} [{run_id}]")
    if record.get("failed"):
        click.secho(f"{record['failed']} request(s) failed, e.g. {record['errors'][:1]}", fg="yellow", err=True)


def _split(text: str, what: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        fail(f"{what} is empty")
    return items


@bench.command("matrix")
@click.option("--methods", required=True, help="Comma-separated methods, e.g. vanilla,dflash,adaflash.")
@click.option("--datasets", required=True, help="Comma-separated datasets (prepared names or FILE.jsonl).")
@click.option("--concurrency", "concurrency_list", default="1", show_default=True, help="Comma-separated, e.g. 1,32,64.")
@click.option("--target", default="smollm2-135m", show_default=True)
@click.option("--draft", "drafts", multiple=True, help="METHOD=DIR: the drafter of a method (repeatable).")
@click.option("--num-prompts", type=click.IntRange(1), default=16, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--temperature", type=click.FloatRange(0.0), default=0.0, show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=1, show_default=True)
@click.option("--eval-accuracy", is_flag=True)
@click.option("--label", default=None, help="A name for the matrix run.")
@click.option("--chat/--no-chat", default=True, show_default=True)
@click.option("--seed", type=int, default=None, help="Sample the prompts with this seed (default: the first N).")
@click.option("--engine", type=click.Choice(["embedded", "sglang"]), default="embedded", show_default=True)
@click.option("--gpus", default=None, help="GPUs for every server (0,1 or cpu).")
@click.option("--context-length", type=click.IntRange(16), default=None, help="Embedded: tokens per sequence slot.")
@click.option("--serve-arg", "serve_args", multiple=True, help="Extra `adaflash serve` argument (repeatable, verbatim).")
@click.option("--ready-timeout", type=click.FloatRange(1), default=900.0, show_default=True,
              help="Seconds to wait for each server's /health.")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "csv", "json"]), default="table",
              show_default=True, help="How to print the comparison at the end.")
@click.pass_context
def matrix(ctx: click.Context, methods: str, datasets: str, concurrency_list: str, target: str, drafts: tuple[str, ...],
           num_prompts: int, max_new_tokens: int, temperature: float, warmup: int, eval_accuracy: bool,
           label: str | None, chat: bool, seed: int | None, engine: str, gpus: str | None, context_length: int | None,
           serve_args: tuple[str, ...], ready_timeout: float, fmt: str) -> None:
    """Serve each method in turn, benchmark every dataset × concurrency, leave the comparison in the run log."""
    import shlex

    from adaflash.bench.matrix import MatrixEvents, MatrixSpec, run_matrix

    method_list = _split(methods, "--methods")
    unknown = [m for m in method_list if m not in METHOD_NAMES]
    if unknown:
        fail(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHOD_NAMES)}")
    try:
        levels = [int(c) for c in _split(concurrency_list, "--concurrency")]
    except ValueError:
        fail(f"--concurrency must be comma-separated integers, got {concurrency_list!r}")
    if any(c < 1 for c in levels):
        fail("--concurrency values must be ≥ 1")
    draft_map: dict[str, str] = {}
    for item in drafts:
        key, sep, value = item.partition("=")
        if not sep or key not in METHOD_NAMES or not value:
            fail(f"--draft takes METHOD=DIR with METHOD one of {', '.join(METHOD_NAMES)}, got {item!r}")
        draft_map[key] = value
    missing = [m for m in method_list if method_of(m).needs_draft_on(engine) and m not in draft_map]
    if engine == "embedded":
        from adaflash.models.builtin_drafters import builtin_drafter_of

        for method in list(missing):
            builtin = builtin_drafter_of(target, method)
            if builtin:
                draft_map[method] = builtin
                missing.remove(method)
                note_builtin_drafter(f"{method} runs", builtin, f"--draft {method}=DIR")
    if missing:
        fail(f"no drafter for {', '.join(missing)}: add --draft METHOD=DIR for each")
    if VANILLA not in method_list:
        click.secho("note: no vanilla in --methods, so the comparison will have no speed-up column", fg="yellow", err=True)
    from adaflash.bench.prompts import domains_of

    dataset_list = _split(datasets, "--datasets")
    prompts, names, suites = {}, [], {}
    for dataset in dataset_list:
        name, rendered = _prompts(ctx, dataset, num_prompts, seed, chat, target)
        domains = domains_of(rendered)
        if domains:  # a suite: each domain a dataset of its own, then an overall row
            suites[name] = domains
            for domain in domains:
                prompts[f"{name}/{domain}"] = [p for p in rendered if p.domain == domain]
                names.append(f"{name}/{domain}")
        else:
            prompts[name] = rendered
            names.append(name)
    spec = MatrixSpec(methods=method_list, datasets=names, concurrency=levels, target=target, drafts=draft_map,
                      num_prompts=num_prompts, max_new_tokens=max_new_tokens, temperature=temperature, warmup=warmup,
                      eval_accuracy=eval_accuracy, label=label, engine=engine, gpus=gpus, context_length=context_length,
                      serve_args=[a for arg in serve_args for a in shlex.split(arg)], ready_timeout=ready_timeout,
                      api_key=os.environ.get("ADAFLASH_API_KEY") or None)
    log = runlog_of(ctx)
    with _Progress(sys.stderr.isatty()) as progress:
        events = MatrixEvents(cell=lambda m, d, c, n: progress.new(f"{m} · {d} · c={c}", n), request=progress.done,
                              message=progress.log)
        matrix_id = run_matrix(spec, log, workspace_of(ctx), prompts, events=events,
                               launcher=_supervised_launcher(log, workspace_of(ctx), spec))
    if suites:
        _suite_overall(log, matrix_id, suites)
    click.secho(f"bench matrix {matrix_id}: {log.get_run(matrix_id).get('note')}", err=True)
    from adaflash.cli.runs_bench import print_comparison

    print_comparison(log, [matrix_id], fmt)


def _suite_overall(log, matrix_id: str, suites: dict[str, list[str]]) -> None:
    """A suite's overall rows (means over its domains) beside the matrix's per-domain results."""
    from adaflash.bench.compare import overall_records, select_records

    records, _ = select_records(log, [matrix_id])
    for suite, domains in suites.items():
        tagged = [{**r, "domain": str(r["dataset"]).split("/", 1)[1]} for r in records
                  if str(r.get("dataset", "")).startswith(suite + "/")]
        for record in overall_records(tagged, suite, domains):
            record["matrix_run"] = matrix_id
            log.add_bench_result(matrix_id, record)


def _supervised_launcher(log, workspace: str, spec):
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


@bench.command("engine")
@click.option("--target", default="smollm2-135m", show_default=True, help="Built-in name, HF model folder or hub id.")
@click.option("--methods", default=VANILLA, show_default=True,
              help=f"Comma-separated, from {', '.join(METHOD_NAMES)}; Vanilla is every row's reference.")
@click.option("--draft-dir", default=None, type=click.Path(file_okay=False),
              help="A folder with one drafter per method: DIR/dflash, DIR/adaflash (or adaflash-online, adaflash-init), "
                   "DIR/eagle3, DIR/mtp.")
@click.option("--draft", "drafts", multiple=True, help="METHOD=DIR: the drafter of a method (repeatable; beats --draft-dir).")
@click.option("--prompts", "dataset", default="gsm8k", show_default=True,
              help="suite (per domain: `data prepare suite`), gsm8k, humaneval, mt-bench, sharegpt (prepared in the "
                   "workspace) or FILE.jsonl (rows with a `domain` are measured per domain).")
@click.option("--num-prompts", type=click.IntRange(1), default=32, show_default=True,
              help="Prompts measured (per domain for the suite).")
@click.option("--batch-sizes", default="1", show_default=True, help="Comma-separated engine batch sizes, e.g. 1,8,32.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--dtype", default="bf16-if-native", show_default=True, help=DTYPE_HELP)
@click.option("--compare-hf", is_flag=True,
              help="Also time transformers' generate() on the same model folder: greedy, and prompt lookup at batch 1.")
@click.option("--prompt-lookup-tokens", type=click.IntRange(1), default=10, show_default=True,
              help="prompt_lookup_num_tokens of the hf-prompt-lookup row.")
@click.option("--warmup", type=click.Choice(["auto", "short", "full", "none"]), default="auto", show_default=True,
              help="Unmeasured pass per engine: short (a few tokens per slot), full (the measured requests once, "
                   "so every CUDA graph is captured before timing); auto = full on CUDA, short elsewhere.")
@click.option("--order", type=click.Choice(["auto", "interleaved", "sequential"]), default="auto", show_default=True,
              help="interleaved: every method's engine gets all prompts queued and they take turns of a few steps, "
                   "each on its own clock, so a drifting machine slows every row alike; sequential: one method "
                   "after the other, all prompts queued at once; auto = interleaved on CPU, sequential on CUDA.")
@engine_options(skip=("max_len", "seed"), notes={"admit_batch": "At most the smallest --batch-sizes."})
@click.option("--profile", type=click.Path(file_okay=False), default=None,
              help="After each measured cell, profile its engine's steps (torch.profiler, off the clock) into this "
                   "folder: RUN-METHOD-bBATCH.top.txt (kernels by their own time) and .trace.json (Chrome trace).")
@click.option("--profile-steps", type=click.IntRange(1), default=32, show_default=True,
              help="Engine steps each profile records, after as many that fill the batch.")
@click.option("--chat/--no-chat", default=True, show_default=True, help="Apply the target's chat template.")
@click.option("--seed", type=int, default=None, help="Sample the prompts with this seed (default: the first N).")
@click.option("--label", default=None, help="A name for this run (shown in comparisons).")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "csv", "json"]), default="table",
              show_default=True, help="How to print the results at the end.")
@click.pass_context
def engine(ctx: click.Context, target: str, methods: str, draft_dir: str | None, drafts: tuple[str, ...], dataset: str,
           num_prompts: int, batch_sizes: str, max_new_tokens: int, device: str, dtype: str, compare_hf: bool,
           prompt_lookup_tokens: int, warmup: str, order: str, engine_cfg: EngineConfig,
           profile: str | None, profile_steps: int, chat: bool, seed: int | None, label: str | None, fmt: str) -> None:
    """Measure every method through the embedded engine side by side, greedy, on the same prompts.

    Per batch size: output tok/s, τ and whether greedy output is identical to our Vanilla's; with
    --compare-hf also transformers' own generate() (plain, and prompt-lookup assisted at batch 1).
    Every row lands in the run log: `adaflash runs compare RUN` shows the speed-ups again.
    """
    from adaflash.bench.engine_bench import EngineBenchEvents, run_engine_bench
    from adaflash.bench.engine_spec import (
        EngineBenchError,
        EngineBenchSpec,
        parse_batch_sizes,
        parse_methods,
        resolve_drafts,
    )
    from adaflash.bench.engine_table import (
        TABLE_COLUMNS,
        against_dflash,
        mismatch_notes,
        speedup_breakdown,
        table_rows,
    )

    explicit: dict[str, str] = {}
    for item in drafts:
        key, sep, value = item.partition("=")
        if not sep or key not in SPECULATIVE_NAMES or not value:
            fail(f"--draft takes METHOD=DIR with METHOD one of {', '.join(SPECULATIVE_NAMES)}, "
                 f"got {item!r}")
        explicit[key] = value
    try:
        method_list = parse_methods(methods)
        sizes = parse_batch_sizes(batch_sizes)
        admit_batch = engine_cfg.admit_batch
        if admit_batch is not None and admit_batch > min(sizes):
            fail(f"--admit-batch {admit_batch}: more than the smallest --batch-sizes ({min(sizes)}), whose engine "
                 f"would never admit a prompt while a row decodes")
        unused = [f"{m}={d}" for m, d in explicit.items() if m not in method_list]
        if unused:  # a drafter given for a method that does not run: most likely a mistyped --methods
            fail(f"--draft {', '.join(unused)}: not in --methods {','.join(method_list)}")
        if draft_dir and not Path(draft_dir).expanduser().is_dir():
            fail(f"--draft-dir {draft_dir}: no such folder")
        draft_map = resolve_drafts(method_list, draft_dir, explicit, target)
    except EngineBenchError as err:
        fail(str(err))
    from adaflash.models.builtin_drafters import builtin_drafter_of
    from adaflash.models.registry import resolve_drafter

    for method, folder in draft_map.items():
        builtin = builtin_drafter_of(target, method) if method not in explicit else None
        if builtin and folder == str(resolve_drafter(builtin)):
            note_builtin_drafter(f"{method} runs", builtin, f"--draft {method}=DIR")
    if VANILLA not in method_list:
        click.secho("note: no vanilla in --methods: no speed-up column and no lossless check", fg="yellow", err=True)
    name, prompts = _prompts(ctx, dataset, num_prompts, seed, chat, target)
    spec = EngineBenchSpec(target=target, methods=method_list, batch_sizes=sizes, drafts=draft_map, dataset=name,
                           max_new_tokens=max_new_tokens, device=device, dtype=dtype, compare_hf=compare_hf,
                           prompt_lookup_tokens=prompt_lookup_tokens, label=label, warmup=warmup,
                           engine_config=engine_cfg, order=order,
                           profile=str(Path(profile).expanduser()) if profile else None, profile_steps=profile_steps)
    log = runlog_of(ctx)
    events = EngineBenchEvents(message=lambda m: click.echo(m, err=True))
    try:
        run_id, records = run_engine_bench(spec, prompts, log, events)
    except EngineBenchError as err:
        fail(str(err))
    from adaflash.cli.common import emit_rows

    rows = table_rows(records)
    if fmt == "json":
        click.echo(json.dumps({"run_id": run_id, "rows": rows, "records": records}, indent=2, default=str))
    else:
        emit_rows(rows, TABLE_COLUMNS, fmt, title=f"bench engine · {spec.target} · {name} · {len(prompts)} prompts · "
                  f"{max_new_tokens} max tokens · {records[0]['hardware'] if records else ''} [{run_id}]")
    for note in mismatch_notes(records):
        click.secho(note, fg="yellow", err=True)
    breakdown = speedup_breakdown(records)
    if breakdown:
        click.echo("where the speed-up goes (engine pass timings):", err=True)
        for line in breakdown:
            click.echo(f"  {line}", err=True)
    products = against_dflash(records)
    if products:
        click.echo("τ × throughput against the dflash row of the same batch:", err=True)
        for line in products:
            click.echo(f"  {line}", err=True)
    click.secho(f"recorded in the run log: adaflash runs compare {run_id}", err=True)


bench.add_command(shift)
bench.add_command(cost)
