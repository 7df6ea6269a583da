"""`adaflash bench matrix`: serve each method in turn, benchmark every dataset × concurrency."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import click

from adaflash.cli.bench import _Progress, _prompts, split, suite_overall, supervised_launcher
from adaflash.cli.common import fail, note_builtin_drafter, runlog_of, workspace_of
from adaflash.cli.groups import Output, use, uses
from adaflash.cli.resolve import draft_map, required, warmup_count
from adaflash.engine.config import EngineConfig
from adaflash.methods import METHOD_NAMES, VANILLA, method_of
from adaflash.options import BenchConfig, InputConfig, ModelConfig, SamplingConfig, ServeConfig


@click.command("matrix")
@uses(use(BenchConfig, only=("methods", "concurrency", "warmup", "eval_accuracy", "label", "length_spread")),
      use(InputConfig, only=("datasets", "num_prompts")), use(ModelConfig, only=("target", "draft")),
      use(SamplingConfig, only=("max_new_tokens", "temperature", "top_p", "chat", "seed")),
      use(ServeConfig, only=("engine", "gpus", "serve_args", "ready_timeout")),
      use(EngineConfig, only=("max_len",), notes={"max_len": "Embedded: each server's."}),
      Output(("table", "markdown", "csv", "json"), help="How to print the comparison at the end."),
      command="bench matrix")
@click.pass_context
def matrix(ctx: click.Context, bench: BenchConfig, inputs: InputConfig, model: ModelConfig, sampling: SamplingConfig,
           serve: ServeConfig, engine: EngineConfig, output: str) -> None:
    """Serve each method in turn, benchmark every dataset × concurrency, leave the comparison in the run log."""
    from adaflash.bench.matrix import MatrixEvents, MatrixSpec, run_matrix
    from adaflash.cli.runs_bench import print_comparison

    required(bench.methods, "--methods", "comma-separated methods, e.g. vanilla,dflash,adaflash")
    required(inputs.datasets, "--datasets", "comma-separated datasets (prepared names or FILE.jsonl)")
    methods = _methods(bench.methods or "")
    drafts = _drafts(methods, model, serve.engine)
    prompts, names, suites = _matrix_prompts(ctx, inputs, sampling, model.target or "")
    spec = MatrixSpec(methods=methods, datasets=names, concurrency=bench.levels, target=model.target or "",
                      drafts=drafts, num_prompts=inputs.num_prompts, max_new_tokens=sampling.max_new_tokens,
                      length_spread=bench.length_spread,
                      temperature=sampling.temperature, top_p=sampling.top_p, warmup=warmup_count(bench), eval_accuracy=bench.eval_accuracy,
                      label=bench.label, engine=serve.engine, gpus=serve.gpus, context_length=engine.max_len,
                      serve_args=[a for arg in serve.serve_args for a in shlex.split(arg)],
                      ready_timeout=serve.ready_timeout, api_key=os.environ.get("ADAFLASH_API_KEY") or None)
    log, workspace = runlog_of(ctx), workspace_of(ctx)
    with _Progress(sys.stderr.isatty()) as progress:
        events = MatrixEvents(cell=lambda m, d, c, n: progress.new(f"{m} · {d} · c={c}", n), request=progress.done,
                              message=progress.log)
        matrix_id = run_matrix(spec, log, workspace, prompts, events=events,
                               launcher=supervised_launcher(log, workspace, spec))
    if suites:
        suite_overall(log, matrix_id, suites)
    click.secho(f"bench matrix {matrix_id}: {log.get_run(matrix_id).get('note')}", err=True)
    print_comparison(log, [matrix_id], output)


def _methods(text: str) -> list[str]:
    methods = split(text, "--methods")
    unknown = [m for m in methods if m not in METHOD_NAMES]
    if unknown:
        fail(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHOD_NAMES)}")
    if VANILLA not in methods:
        click.secho("note: no vanilla in --methods, so the comparison will have no speed-up column", fg="yellow", err=True)
    return methods


def _drafts(methods: list[str], model: ModelConfig, engine: str) -> dict[str, str]:
    """METHOD=DIR per --draft, and the built-in drafter of a built-in target for the others that need one."""
    drafts = draft_map(model)
    missing = [m for m in methods if method_of(m).needs_draft_on(engine) and m not in drafts]
    if engine == "embedded":
        from adaflash.models.builtin_drafters import builtin_drafter_of

        for method in list(missing):
            builtin = builtin_drafter_of(model.target or "", method)
            if builtin:
                drafts[method] = builtin
                missing.remove(method)
                note_builtin_drafter(f"{method} runs", builtin, f"--draft {method}=DIR")
    if missing:
        fail(f"no drafter for {', '.join(missing)}: add --draft METHOD=DIR for each")
    return drafts


def _matrix_prompts(ctx: click.Context, inputs: InputConfig, sampling: SamplingConfig,
                    target: str) -> tuple[dict[str, Any], list[str], dict[str, list[str]]]:
    """(prompts per dataset, dataset names, suites' domains): a suite is one dataset per domain."""
    from adaflash.bench.prompts import domains_of

    prompts, names, suites = {}, [], {}
    for dataset in split(inputs.datasets or "", "--datasets"):
        name, rendered = _prompts(ctx, dataset, inputs.num_prompts, sampling.seed, sampling.chat, target)
        domains = domains_of(rendered)
        if domains:  # a suite: each domain a dataset of its own, then an overall row
            suites[name] = domains
            for domain in domains:
                prompts[f"{name}/{domain}"] = [p for p in rendered if p.domain == domain]
                names.append(f"{name}/{domain}")
        else:
            prompts[name] = rendered
            names.append(name)
    return prompts, names, suites
